// Reads of the outbox's ready queue and key order straight from their
// indexes (found by OID in the extension's schema), with a snapshot taken
// when the read starts. These reads run on every claim, enqueue and ack:
// going through the index directly keeps their cost what the index walk
// costs, whatever the planner would estimate from stale statistics (a
// sorted bitmap scan over all the events of a key would read its whole
// backlog). Ready-queue layout (0.5.0) only.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"
#include "pg/outbox/topic_set.hpp"

extern "C" {
#include "storage/itemptr.h"
}

namespace idem::pg {

// A ready event read from a ready index.
struct ReadyRow {
    std::int64_t id;
    Micros ready_at;
    TransactionId xmax;  // a transaction that locked or changed it (invalid: none, or a multixact)
    ItemPointerData ctid;
};

// A read of every topic that keeps only those of `topics`. Due events of other topics are passed over,
// at most `foreign_limit` in all the reads of the claim; a read that would
// pass over more stops there and sets `stopped`. `first_due` is the
// ready_at of the first due event of any topic read (when `any_due`), where
// a read of every topic would have found its first.
struct TopicFilter {
    const TopicSet* topics;
    long foreign_limit;
    long foreign_read;
    bool stopped;
    bool any_due;
    Micros first_due;
};

// Up to `limit` ready events of `topic` (nullptr: every topic, or those of
// `only`) with `from <= ready_at <= now` after (after_at, after_id) in
// (ready_at, id) order that are due: pending, or in flight with fewer
// attempts than their cap (`max_attempts` when they recorded none). Returns
// how many; *seen is the last ready event read, due or not (for the next
// window's start).
int read_ready(const text* topic, Micros from, Micros after_at, std::int64_t after_id, Micros now,
               int max_attempts, int limit, ReadyRow* out, Micros* seen_at, std::int64_t* seen_id,
               TopicFilter* only = nullptr);

// An event of a key in its key's order, read from the key-order index:
// pending, in flight, or dead (a dead event holds the later ones back).
struct KeyEvent {
    bool found;
    std::int64_t id;
    std::int64_t place;  // COALESCE(key_seq, id)
    bool ready;          // it is its key's head
    bool pending;
};

// The next id of the outbox's sequence (an enqueue takes it first, so that
// its look at its key's events can start from it).
std::int64_t next_event_id();

// A reader of the key-order index, with a snapshot taken when it opens:
// open, read as many keys as needed, close (no SQL in between). Trivially
// destructible; an error releases what it holds.
struct KeyOrderReader {
    Relation heap;
    Relation index;
    Snapshot snapshot;
    IndexScanDesc scan;
    TupleTableSlot* slot;
    const text* topic;  // the key being read
    const text* key;
};
KeyOrderReader open_key_order();
void close_key_order(KeyOrderReader* reader);

// The first live event of (topic, key) at or after `place`, in key order,
// whose id is not among the sorted `skip` ids (none found: found false).
KeyEvent first_event_from(KeyOrderReader* reader, const text* topic, const text* key,
                          std::int64_t place, const std::int64_t* skip = nullptr,
                          int skip_count = 0);
// Up to `limit` live events of (topic, key) after (place, after_id) in key
// order, with places from `place` to `upto`.
int key_events_from(KeyOrderReader* reader, const text* topic, const text* key, std::int64_t place,
                    std::int64_t after_id, std::int64_t upto, KeyEvent* out, int limit);
// The last live event of (topic, key) before `place` (the newest one when
// `place` is INT64_MAX).
KeyEvent last_event_before(KeyOrderReader* reader, const text* topic, const text* key,
                           std::int64_t place);

}  // namespace idem::pg
