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

// Which versions of the grant rows give the role its topics (the role has
// the privileges of each row's role): how many, whether one grants every
// topic, and a key naming the rows' versions, which changes whenever one of
// them, or the set of grants that apply, does.
Statement kGrantVersions = {
    "SELECT pg_catalog.count(*), pg_catalog.bool_or(g.topics IS NULL), "
    "       pg_catalog.string_agg(g.ctid::pg_catalog.text || '/' || g.xmin::pg_catalog.text || '/' "
    "                             || pg_catalog.pg_column_size(g.topics)::pg_catalog.text, ',' "
    "                             ORDER BY g.ctid) "
    "  FROM @relay_grants@ g "
    " WHERE pg_catalog.pg_has_role($1, g.role::pg_catalog.oid, 'USAGE')",
    1, {OIDOID}, nullptr};

// The topics of every grant the role has the privileges of.
Statement kGrantedTopics = {
    "SELECT pg_catalog.array_agg(t.topic) "
    "  FROM @relay_grants@ g, pg_catalog.unnest(g.topics) AS t(topic) "
    " WHERE pg_catalog.pg_has_role($1, g.role::pg_catalog.oid, 'USAGE')",
    1, {OIDOID}, nullptr};

// The topics of the events, in id order.
Statement kEventTopics = {
    "SELECT o.topic FROM @outbox@ o WHERE o.id = ANY ($1) ORDER BY o.id", 1, {INT8ARRAYOID},
    nullptr};

// The last role's allowed topics and their set; role InvalidOid: none.
struct KeptScope {
    Oid role;
    const char* versions;  // in topics.memory
    KeptTopics topics;
};
KeptScope kept{};

// The allowed topics of `role`, whose grant rows' versions are `versions`:
// the kept ones when they come from the same rows, else read anew and kept.
const KeptTopics& granted_topics(Oid role, const char* versions) {
    if (kept.role == role && strcmp(kept.versions, versions) == 0) return kept.topics;
    Params params;
    params.add(ObjectIdGetDatum(role));
    execute(kGrantedTopics, params, 1);
    bool isnull = false;
    const Datum topics = column(1, &isnull);
    kept.role = InvalidOid;  // until the new list and its versions are kept whole
    keep_topics(&kept.topics, isnull ? PointerGetDatum(construct_empty_array(TEXTOID)) : topics);
    kept.versions = MemoryContextStrdup(kept.topics.memory, versions);
    kept.role = role;
    return kept.topics;
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
    const RelayScope unlimited{0, false, nullptr};
    if (superuser_arg(caller) || has_privs_of_role(caller, objects.owner) ||
        !OidIsValid(objects.relay_grants))
        return unlimited;
    Params params;
    params.add(ObjectIdGetDatum(caller));
    execute(kGrantVersions, params, 1);
    const std::int64_t grants = column_int8(1).value_or(0);
    bool isnull = false;
    const Datum every = column(2, &isnull);
    const bool grant_for_every_topic = !isnull && DatumGetBool(every);
    // No grant at all: the right to execute was given by hand, unlimited.
    if (grants == 0 || grant_for_every_topic) return unlimited;
    const KeptTopics& granted = granted_topics(caller, TextDatumGetCString(column(3, &isnull)));
    return RelayScope{PointerGetDatum(granted.array), true, &granted.set};
}

TopicLimit claimable_topics(const RelayScope& scope, Datum requested, bool has_requested) {
    if (!scope.limited) return TopicLimit{requested, has_requested, nullptr};
    if (!has_requested) return TopicLimit{scope.topics, true, scope.set};
    ArrayType* array = DatumGetArrayTypeP(requested);
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &count);
    for (int i = 0; i < count; ++i)
        if (!nulls[i] && !topic_set_contains(*scope.set, DatumGetTextPP(elements[i])))
            refuse("claim", text_to_cstring(DatumGetTextPP(elements[i])));
    return TopicLimit{requested, true, nullptr};
}

void check_event_topics(const RelayScope& scope, Datum ids, const char* what) {
    if (!scope.limited) return;
    Params params;
    params.add(ids);
    const std::uint64_t rows = execute(kEventTopics, params);
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        const text* topic = DatumGetTextPP(column(1, &isnull, row));
        if (!topic_set_contains(*scope.set, topic)) refuse(what, text_to_cstring(topic));
    }
}

void check_topic(const RelayScope& scope, const text* topic, const char* what) {
    if (scope.limited && !topic_set_contains(*scope.set, topic))
        refuse(what, text_to_cstring(topic));
}

}  // namespace idem::pg
