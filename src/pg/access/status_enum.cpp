#include "pg/access/status_enum.hpp"

extern "C" {
#include "catalog/pg_enum.h"
}

namespace idem::pg {

namespace {

struct LabelCache {
    Oid enum_type;
    Oid labels[kStatusCount];
};

LabelCache cache;

const LabelCache& labels_of(Oid enum_type) {
    if (cache.enum_type == enum_type) return cache;
    for (int i = 0; i < kStatusCount; ++i) {
        const char* label = status_label(static_cast<Status>(i));
        HeapTuple tuple = SearchSysCache2(ENUMTYPOIDNAME, ObjectIdGetDatum(enum_type),
                                          CStringGetDatum(label));
        if (!HeapTupleIsValid(tuple))
            elog(ERROR, "idempotency: enum label %s missing from type %u", label, enum_type);
        cache.labels[i] = reinterpret_cast<Form_pg_enum>(GETSTRUCT(tuple))->oid;
        ReleaseSysCache(tuple);
    }
    cache.enum_type = enum_type;
    return cache;
}

}  // namespace

Datum status_datum(Oid enum_type, Status status) {
    return ObjectIdGetDatum(labels_of(enum_type).labels[static_cast<int>(status)]);
}

Status status_from_datum(Oid enum_type, Datum value) {
    const LabelCache& known = labels_of(enum_type);
    const Oid label = DatumGetObjectId(value);
    for (int i = 0; i < kStatusCount; ++i)
        if (known.labels[i] == label) return static_cast<Status>(i);
    elog(ERROR, "idempotency: unknown idem_status value %u", label);
    return Status::Received;  // not reached
}

}  // namespace idem::pg
