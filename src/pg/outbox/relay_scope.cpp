#include "pg/outbox/relay_scope.hpp"

#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/owner_scope.hpp"

extern "C" {
#include "utils/acl.h"
#include "utils/array.h"
}

namespace idem::pg {

namespace {

// The topics of every grant the role has the privileges of; a NULL among
// them grants every topic.
Statement kGrantedTopics = {
    "SELECT pg_catalog.bool_or(g.topics IS NULL), "
    "       pg_catalog.array_agg(t.topic) FILTER (WHERE t.topic IS NOT NULL), "
    "       pg_catalog.count(*) "
    "  FROM @relay_grants@ g LEFT JOIN LATERAL pg_catalog.unnest(g.topics) AS t(topic) ON true "
    " WHERE pg_catalog.pg_has_role($1, g.role::pg_catalog.oid, 'USAGE')",
    1, {OIDOID}, nullptr};

Statement kForeignEvent = {
    "SELECT o.topic FROM @outbox@ o WHERE o.id = ANY ($1) AND o.topic <> ALL ($2) LIMIT 1", 2,
    {INT8ARRAYOID, TEXTARRAYOID}, nullptr};

bool topic_in(Datum topics, const text* topic) {
    ArrayType* array = DatumGetArrayTypeP(topics);
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &count);
    for (int i = 0; i < count; ++i) {
        if (nulls[i]) continue;
        const text* element = DatumGetTextPP(elements[i]);
        if (VARSIZE_ANY_EXHDR(element) == VARSIZE_ANY_EXHDR(topic) &&
            memcmp(VARDATA_ANY(element), VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic)) == 0)
            return true;
    }
    return false;
}

[[noreturn]] void refuse(const char* what, const char* topic) {
    ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                    errmsg("role %s may not %s events of topic \"%s\"",
                           GetUserNameFromId(calling_role(), true), what, topic),
                    errhint("The extension's owner gives a relay role its topics with "
                            "idempotency.grant_relay(role, topics).")));
    pg_unreachable();
}

}  // namespace

RelayScope relay_scope() {
    const ExtensionObjects& objects = extension_objects();
    const Oid caller = calling_role();
    RelayScope scope{true, 0};
    if (superuser_arg(caller) || has_privs_of_role(caller, objects.owner) ||
        !OidIsValid(objects.relay_grants))
        return scope;
    Params params;
    params.add(ObjectIdGetDatum(caller));
    execute(kGrantedTopics, params, 1);
    bool isnull = false;
    const Datum every = column(1, &isnull);
    const bool grant_for_every_topic = !isnull && DatumGetBool(every);
    const std::int64_t grants = column_int8(3).value_or(0);
    // No grant at all: the right to execute was given by hand, unlimited.
    if (grants == 0 || grant_for_every_topic) return scope;
    bool present = false;
    const Datum topics = column_copy(2, &present);
    scope.every_topic = false;
    scope.topics = present ? topics : PointerGetDatum(construct_empty_array(TEXTOID));
    return scope;
}

Datum claimable_topics(const RelayScope& scope, Datum requested, bool has_requested,
                       bool* has_topics) {
    if (scope.every_topic) {
        *has_topics = has_requested;
        return requested;
    }
    *has_topics = true;
    if (!has_requested) return scope.topics;
    ArrayType* array = DatumGetArrayTypeP(requested);
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &count);
    for (int i = 0; i < count; ++i)
        if (!nulls[i] && !topic_in(scope.topics, DatumGetTextPP(elements[i])))
            refuse("claim", text_to_cstring(DatumGetTextPP(elements[i])));
    return requested;
}

void check_event_topics(const RelayScope& scope, Datum ids, const char* what) {
    if (scope.every_topic) return;
    Params params;
    params.add(ids).add(scope.topics);
    if (execute(kForeignEvent, params, 1) > 0) {
        bool isnull = false;
        refuse(what, TextDatumGetCString(column(1, &isnull)));
    }
}

void check_topic(const RelayScope& scope, const text* topic, const char* what) {
    if (!scope.every_topic && !topic_in(scope.topics, topic)) refuse(what, text_to_cstring(topic));
}

}  // namespace idem::pg
