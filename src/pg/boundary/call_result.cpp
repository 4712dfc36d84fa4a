#include "pg/boundary/call_result.hpp"

extern "C" {
#include "utils/typcache.h"
}

namespace idem::pg {

namespace {

TupleDesc result_desc_now(FunctionCallInfo fcinfo) {
    const Oid type = fcinfo->flinfo->fn_expr != nullptr ? get_fn_expr_rettype(fcinfo->flinfo)
                                                        : InvalidOid;
    TupleDesc desc = nullptr;
    if (type == InvalidOid || !type_is_rowtype(type) || type == RECORDOID) {
        if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
            elog(ERROR, "idempotency: function must return a composite type");
        return desc;
    }
    desc = lookup_rowtype_tupdesc_copy(type, -1);
    const ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    if (rsinfo == nullptr || !IsA(rsinfo, ReturnSetInfo) || rsinfo->expectedDesc == nullptr ||
        rsinfo->expectedDesc->natts >= desc->natts)
        return desc;
    TupleDesc planned = CreateTupleDescCopy(rsinfo->expectedDesc);
    planned->tdtypeid = RECORDOID;
    planned->tdtypmod = -1;
    return BlessTupleDesc(planned);
}

}  // namespace

TupleDesc call_result_desc(FunctionCallInfo fcinfo) {
    // Made once per call site (its FmgrInfo), in the memory of that call
    // site: the planned row type and the declared one cannot change under
    // it, and the calls of one statement (a claim per row) need no copy each.
    FmgrInfo* flinfo = fcinfo->flinfo;
    if (flinfo->fn_extra == nullptr) {
        const MemoryContext caller = MemoryContextSwitchTo(flinfo->fn_mcxt);
        flinfo->fn_extra = result_desc_now(fcinfo);
        MemoryContextSwitchTo(caller);
    }
    return static_cast<TupleDesc>(flinfo->fn_extra);
}

Datum row_as_planned(Datum row, TupleDesc desc) {
    HeapTupleHeader header = DatumGetHeapTupleHeader(row);
    if (HeapTupleHeaderGetTypeId(header) == desc->tdtypeid &&
        HeapTupleHeaderGetTypMod(header) == desc->tdtypmod)
        return row;
    TupleDesc now = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(header),
                                           HeapTupleHeaderGetTypMod(header));
    HeapTupleData tuple{};
    tuple.t_len = HeapTupleHeaderGetDatumLength(header);
    tuple.t_data = header;
    Datum* values = static_cast<Datum*>(palloc(now->natts * sizeof(Datum)));
    bool* nulls = static_cast<bool*>(palloc(now->natts * sizeof(bool)));
    heap_deform_tuple(&tuple, now, values, nulls);
    ReleaseTupleDesc(now);
    return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

}  // namespace idem::pg
