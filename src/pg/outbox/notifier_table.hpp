// The notifier table (library preloaded only): one slot per database in
// shared memory through which committed outbox topics reach that database's
// notifier (pg/outbox/notifier.cpp), which sends the NOTIFYs.
//
// The rule that keeps every wake-up: a committing backend pins the slot
// before its commit (only while a notifier is attached and accepting) and
// reserves room for its topics; after the commit it publishes the topics and
// unpins. A notifier leaves only when nothing is pinned and every topic has
// been sent; topics stay in the slot until their NOTIFY has committed, so a
// notifier that dies leaves them to the next one, which the launcher starts.
//
// A slot holds a bounded set of topics. Commits whose topics do not fit
// (more distinct topics waiting than the slot holds, or more in one
// transaction) mark the slot overflowed instead, and the notifier's next
// round sends one notification with the payload "*" (any topic) besides the
// topics it holds: with thousands of active topics, commits still never
// notify themselves, which PostgreSQL would serialise.
#pragma once

#include <cstdint>

#include "core/validate.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/runtime/launcher.hpp"

namespace idem::pg {

inline constexpr int kNotifierTopics = 64;   // distinct topics waiting in one slot
// The payload that stands for "events of any topic committed".
inline constexpr const char* kAnyTopic = "*";
inline constexpr int kTopicBytes = static_cast<int>(kMaxNameBytes) + 1;

// Topics as NUL-terminated names (a topic never contains a NUL byte).
struct TopicList {
    int count;
    char names[kNotifierTopics][kTopicBytes];
};

// True when the library was preloaded and the table exists.
bool notifier_table_available();

// Called from _PG_init while preloading.
// Its part of the shared memory (listed in module.cpp): size, lock, set-up
// (under AddinShmemInitLock).
Size notifier_table_size();
void request_notifier_table_lock();
void init_notifier_table();

// --- committing backends ---------------------------------------------------
// Before the commit: pins the database's slot and reserves room for `topics`
// entries, or, when they do not fit or `overflowed` (the transaction had
// more than a slot holds), for none: *overflow is then set, and the commit
// will mark the slot overflowed. Returns the slot, or -1 when no notifier
// accepts pins (none attached, leaving, no free slot); then a notifier is
// asked for.
int pin_notifier(Oid database, int topics, bool overflowed, bool* overflow);
// After the commit (topics given) or the abort (nullptr): releases the
// reservation and the pin, adds the topics (or marks the slot overflowed)
// and wakes the notifier.
void publish_and_unpin(int slot, int reserved, const TopicList* topics, bool overflow);

// --- the notifier ------------------------------------------------------------
// Attaches the calling process as the slot's notifier; false when the slot
// belongs to another database or already has a notifier.
bool attach_notifier(int slot, Oid database);
// Copies the waiting topics (they stay in the slot until topics_sent), and
// in *overflow_marks the slot's overflow marks when some are not yet
// notified (else 0). Returns the number of notifications to send: the
// topics, and one kAnyTopic for the marks.
int take_topics(int slot, TopicList* out, std::uint64_t* overflow_marks);
// The first `count` topics taken, and kAnyTopic for the marks taken, have
// been notified; topics published again since they were taken stay for the
// next round.
void topics_sent(int slot, int count, std::uint64_t overflow_marks);
// No more pins are accepted: committers notify in their own transaction.
void stop_accepting(int slot);
// Detaches when nothing is pinned or waiting; frees the slot unless another
// notifier is wanted. True when detached.
bool try_detach(int slot);
// Exit callback: detaches whatever is left and asks for a successor when
// topics or pins remain.
void detach_on_exit(int code, Datum slot);

// --- the launcher --------------------------------------------------------------
void set_launcher_latch(Latch* latch);
// For each slot, the database whose notifier is wanted and not attached, or
// InvalidOid.
void wanted_notifiers(Oid databases[kNotifierSlots]);
// The database is gone: frees its slot.
void forget_notifier_slot(int slot, Oid database);

}  // namespace idem::pg
