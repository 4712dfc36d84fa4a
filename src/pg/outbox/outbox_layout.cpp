#include "pg/outbox/outbox_layout.hpp"

#include "pg/boundary/extension_objects.hpp"
#include "pg/outbox/outbox_store.hpp"

extern "C" {
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

std::uint64_t known_generation = 0;
bool has_ready_queue = false;

OutboxColumns columns;
Oid columns_table = InvalidOid;
std::uint64_t columns_generation = 0;  // of the extension's objects they were found for
TupleDesc columns_layout = nullptr;    // the descriptor they were found in
int columns_natts = 0;                 // and its columns (a new one may take its memory)

// Each column by its name (get_attnum gives 0, InvalidAttrNumber, for a
// column the table has not got).
struct NamedColumn {
    AttrNumber OutboxColumns::*column;
    const char* name;
};
constexpr NamedColumn kColumns[] = {
    {&OutboxColumns::id, "id"},
    {&OutboxColumns::topic, "topic"},
    {&OutboxColumns::key, "key"},
    {&OutboxColumns::payload, "payload"},
    {&OutboxColumns::headers, "headers"},
    {&OutboxColumns::dedup_key, "dedup_key"},
    {&OutboxColumns::state, "state"},
    {&OutboxColumns::attempts, "attempts"},
    {&OutboxColumns::enqueued_at, "enqueued_at"},
    {&OutboxColumns::available_at, "available_at"},
    {&OutboxColumns::lease_until, "lease_until"},
    {&OutboxColumns::relay, "relay"},
    {&OutboxColumns::last_error, "last_error"},
    {&OutboxColumns::delivered_at, "delivered_at"},
    {&OutboxColumns::updated_at, "updated_at"},
    {&OutboxColumns::max_attempts, "max_attempts"},
    {&OutboxColumns::ready_at, "ready_at"},
    {&OutboxColumns::key_seq, "key_seq"},
};

}  // namespace

bool outbox_has_ready_queue() {
    const ExtensionObjects& objects = extension_objects();
    if (known_generation != objects.generation) {
        has_ready_queue = OidIsValid(objects.outbox) &&
                          get_attnum(objects.outbox, "ready_at") != InvalidAttrNumber;
        known_generation = objects.generation;
    }
    return has_ready_queue;
}

const OutboxColumns& outbox_columns(Relation outbox) {
    const TupleDesc desc = RelationGetDescr(outbox);
    const std::uint64_t generation = extension_objects().generation;
    const Oid table = RelationGetRelid(outbox);
    if (columns_table == table && columns_generation == generation &&
        columns_layout == desc && columns_natts == desc->natts)
        return columns;
    for (const NamedColumn& named : kColumns) columns.*named.column = get_attnum(table, named.name);
    columns.pending = outbox_state_value("pending");
    columns.in_flight = outbox_state_value("in_flight");
    columns.delivered = outbox_state_value("delivered");
    columns.dead = outbox_state_value("dead");
    columns_table = table;
    columns_generation = generation;
    columns_layout = desc;
    columns_natts = desc->natts;
    return columns;
}

}  // namespace idem::pg
