#include "pg/outbox/outbox_rows.hpp"

#include <algorithm>

#include "pg/boundary/extension_objects.hpp"
#include "pg/boundary/row_access.hpp"
#include "pg/outbox/outbox_layout.hpp"

namespace idem::pg {

InsertedEvent insert_new_event(const NewEvent& event, Micros now, std::int64_t id, bool head) {
    OpenTable table = open_to_write(extension_objects().outbox);
    const OutboxColumns& at = outbox_columns(table.heap);
    TupleTableSlot* row = new_row(&table);
    set_column(row, at.id, Int64GetDatum(id));
    set_column(row, at.topic, PointerGetDatum(event.topic));
    if (event.key != nullptr) set_column(row, at.key, PointerGetDatum(event.key));
    set_column(row, at.payload, event.payload);
    if (event.has_headers) set_column(row, at.headers, event.headers);
    set_column(row, at.enqueued_at, TimestampTzGetDatum(now));
    set_column(row, at.available_at, TimestampTzGetDatum(event.available_at));
    set_column(row, at.updated_at, TimestampTzGetDatum(now));
    if (head) set_column(row, at.ready_at, TimestampTzGetDatum(std::max(event.available_at, now)));
    insert_row(&table, row);
    // What RETURNING id, ready_at IS NOT NULL reads: the row inserted.
    bool isnull = false;
    const std::int64_t inserted_id = DatumGetInt64(slot_getattr(row, at.id, &isnull));
    (void)slot_getattr(row, at.ready_at, &isnull);
    const InsertedEvent inserted{inserted_id, !isnull};
    close_table(&table);
    return inserted;
}

}  // namespace idem::pg
