// idempotency.drop_guard(), the event trigger that stands before DROP
// EXTENSION idempotency (and DROP SCHEMA of its schema, DROP OWNED BY its
// owner, which take it with them): undelivered outbox events (pending, in
// flight or dead) and PROCESSING keys are work in progress that a drop would
// destroy without a word, so the drop is refused while there is any, unless
// idempotency.force_drop is on. A transaction that holds outbox claims it
// has not written yet cannot drop the extension at all: its commit would
// write the claims into tables that are gone.
#include "core/error.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/outbox/held.hpp"

extern "C" {
#include "commands/event_trigger.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
}

namespace idem::pg {

namespace {

Statement kWorkLeft = {
    "SELECT (SELECT pg_catalog.count(*) FROM @outbox@ WHERE state <> 'delivered'), "
    "       (SELECT pg_catalog.count(*) FROM @keys@ WHERE status = 'PROCESSING')",
    0, {}, nullptr};

bool names_in(List* objects, const char* name) {
    ListCell* cell;
    foreach (cell, objects) {
        Node* object = static_cast<Node*>(lfirst(cell));
        if (IsA(object, String) && strcmp(strVal(object), name) == 0) return true;
    }
    return false;
}

// Whether the command would drop the extension.
bool drops_extension(Node* command, const ExtensionObjects& objects) {
    if (IsA(command, DropStmt)) {
        const auto* drop = reinterpret_cast<DropStmt*>(command);
        if (drop->removeType == OBJECT_EXTENSION) return names_in(drop->objects, "idempotency");
        if (drop->removeType == OBJECT_SCHEMA)
            return names_in(drop->objects, get_namespace_name(objects.schema));
        return false;
    }
    if (IsA(command, DropOwnedStmt)) {
        ListCell* cell;
        foreach (cell, reinterpret_cast<DropOwnedStmt*>(command)->roles) {
            const Oid role = get_rolespec_oid(static_cast<RoleSpec*>(lfirst(cell)), true);
            if (role == objects.owner) return true;
        }
    }
    return false;
}

Datum drop_guard_body(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
        throw Error("39P01", "idempotency.drop_guard() runs only as an event trigger");
    const auto* event = reinterpret_cast<EventTriggerData*>(fcinfo->context);
    // Without the check of the schema's owner: a schema handed to another
    // role must not stop every DROP SCHEMA in the database, nor the drop of
    // the extension. The count below names the member tables by OID, which
    // the schema's owner can neither drop nor rename.
    const ExtensionObjects* objects = find_extension_objects();
    if (objects == nullptr || !drops_extension(event->parsetree, *objects)) PG_RETURN_VOID();
    if (holds_any())
        ereport(ERROR, (errcode(ERRCODE_OBJECT_IN_USE),
                        errmsg("cannot drop extension idempotency in a transaction that holds "
                               "outbox claims it has not written yet"),
                        errhint("Commit or roll back the transaction that called outbox_claim "
                                "first, then drop the extension.")));
    if (settings::force_drop) PG_RETURN_VOID();
    connect_spi();
    execute(kWorkLeft, Params{}, 1);
    const std::int64_t events = column_int8(1).value_or(0);
    const std::int64_t keys = column_int8(2).value_or(0);
    finish_spi();
    if (events > 0 || keys > 0)
        ereport(ERROR,
                (errcode(ERRCODE_OBJECT_IN_USE),
                 errmsg("cannot drop extension idempotency: the outbox holds %lld undelivered "
                        "event(s) and %lld key(s) are PROCESSING",
                        static_cast<long long>(events), static_cast<long long>(keys)),
                 errdetail("Dropping the extension destroys its tables, and with them that "
                           "work."),
                 errhint("Let the relays deliver the events and the workers finish (redrive or "
                         "delete dead letters), or SET idempotency.force_drop = on to drop "
                         "everything anyway.")));
    PG_RETURN_VOID();
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_drop_guard, idem::pg::drop_guard_body)
