// Whether an index of the outbox is one of the three that claims and
// enqueues read directly (index.cpp), as the extension defines it: the same
// columns and expressions in the same order, ascending with the default
// operator classes and the columns' collations, the same WHERE clause,
// valid. Their scan keys are built for those columns, so an index of another
// shape under one of their names (dropped and created again otherwise, or
// two names swapped) is not read: it would answer wrongly, or crash the
// backend on a scan key of another type.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

enum class OutboxIndex {
    Ready,     // outbox_ready: (topic, ready_at, id) WHERE ready_at IS NOT NULL
    ReadyAll,  // outbox_ready_all: (ready_at, id) WHERE ready_at IS NOT NULL
    // outbox_key_order: (hashtextextended(key, hashtextextended(topic, 0)),
    // COALESCE(key_seq, id), id) WHERE state IN (pending, in_flight, dead)
    // AND key IS NOT NULL
    KeyOrder,
};

// The outbox's columns and state values the shapes name.
struct OutboxShapeColumns {
    AttrNumber id, ready_at, state, key_seq, topic, key;
    Oid topic_collation, key_collation;
    Datum pending, in_flight, dead;
};

// The name the extension gives it, and its definition (for an error's hint).
const char* outbox_index_name(OutboxIndex which);
const char* outbox_index_definition(OutboxIndex which);

// `index` is an open index of the outbox.
bool has_outbox_index_shape(Relation index, OutboxIndex which, const OutboxShapeColumns& columns);

}  // namespace idem::pg
