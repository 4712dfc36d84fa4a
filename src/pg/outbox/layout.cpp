#include "pg/outbox/layout.hpp"

#include "pg/access/extension_objects.hpp"
#include "pg/outbox/store.hpp"

extern "C" {
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

std::uint64_t known_layout = 0;
bool has_ready_queue = false;

OutboxColumns columns;
Oid columns_table = InvalidOid;
std::uint64_t columns_layout = 0;  // of the extension's objects they were found for

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
    if (known_layout != objects.layout) {
        has_ready_queue = OidIsValid(objects.outbox) &&
                          get_attnum(objects.outbox, "ready_at") != InvalidAttrNumber;
        known_layout = objects.layout;
    }
    return has_ready_queue;
}

const OutboxColumns& outbox_columns(Relation outbox) {
    // Any change of the table's columns invalidates it, and so the layout.
    const std::uint64_t layout = extension_objects().layout;
    const Oid table = RelationGetRelid(outbox);
    if (columns_table == table && columns_layout == layout) return columns;
    for (const NamedColumn& named : kColumns) columns.*named.column = get_attnum(table, named.name);
    columns.pending = outbox_state_value("pending");
    columns.in_flight = outbox_state_value("in_flight");
    columns.delivered = outbox_state_value("delivered");
    columns.dead = outbox_state_value("dead");
    columns_table = table;
    columns_layout = layout;
    return columns;
}

}  // namespace idem::pg
