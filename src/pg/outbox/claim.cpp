#include "pg/outbox/claim.hpp"

#include <algorithm>
#include <cstring>

#include "pg/outbox/claim_walk.hpp"
#include "pg/outbox/heads.hpp"
#include "pg/outbox/held.hpp"
#include "pg/outbox/holders.hpp"
#include "pg/outbox/index.hpp"
#include "pg/outbox/layout.hpp"
#include "pg/outbox/ready_floor.hpp"
#include "pg/outbox/rows.hpp"

extern "C" {
#include "storage/itemptr.h"
#include "storage/procarray.h"
#include "utils/memutils.h"
}

// What a claim may hand out (ready-queue layout, 0.5.0). Only ready events:
// heads of their keys and events without a key (pg/outbox/heads.hpp). A
// ready event is due when its ready_at has come: pending and due (its
// deliver_at, its retry's backoff), or in flight with a lease that ran out
// and attempts left (maintenance buries the rest). One head per key means
// at most one event of a key in flight, and the next one only after it.
//
// How they are found. Each source of the claim (each requested topic, or
// every topic) is read from its ready index (directly: pg/outbox/index.hpp)
// in (ready_at, id) order, from
// where its last claim found ready events (pg/outbox/ready_floor.hpp) up to
// now, a window at a time; the sources are merged in that order. Events
// waiting behind a head, events scheduled or retrying later and events in
// flight are not in the range read, so a claim reads its batch, the events
// held by other relays' running transactions before it, and the few heads
// that have run out of attempts. Events held by another running
// transaction are passed over without trying their lock (its xmax); the
// others are locked by row version, SKIP LOCKED, oldest first and no more
// than the batch still needs, each checked again once locked (still ready
// and due), and handed out. The claim itself is written at
// commit (held.hpp).
//
// With runs (idempotency.outbox_run_length above 1), once the claim has
// all the heads it can get, the room its batch has left goes to the
// events waiting behind them, head by head in the order handed out
// (pg/outbox/rows.hpp): a claim over many keys hands out as many
// keys as it can, so that a relay delivers them side by side, and one over
// few keys with long backlogs fills its batch with their runs.
//
// A claim of many topics reads every topic instead, passing over the
// events of the others, for as long as that costs less than a read per
// topic would; past that it reads its topics one by one from where it got
// to. Its cost then follows its batch, not the length of its list.

namespace idem::pg {

namespace {

constexpr long kMaxWindow = 8192;
// From this many listed topics a claim reads every topic and keeps its
// own: one read per topic costs more than the batch from some dozens on.
constexpr int kFilteredFrom = 16;
// Events of other topics such a claim passes over, per listed topic,
// before it reads its topics one by one: about what a read per topic costs.
constexpr long kForeignPerTopic = 4;

// One source: a topic (or every topic), read in windows.
struct Source {
    const text* topic;  // nullptr: every topic (of `filter`, when given)
    TopicFilter* filter;
    bool marks;         // its first ready event is the next claim's mark
    ScanStart start;
    Micros after_at;    // the last row read: the next window starts after it
    std::int64_t after_id;
    long window;
    ReadyRow* rows;          // the current window, from `next` on not yet merged
    int count;
    int next;
    bool exhausted;     // the last window was the last
    bool read_any;
    Micros first_ready;  // of the first window: the next claim's mark
};

void read_window(Source* source, const ClaimRequest& request, Micros now) {
    source->rows = static_cast<ReadyRow*>(palloc(sizeof(ReadyRow) * (source->window + 1)));
    Micros seen_at = source->after_at;
    std::int64_t seen_id = source->after_id;
    const int rows = read_ready(source->topic, source->start.from, source->after_at,
                                source->after_id, now, request.max_attempts,
                                static_cast<int>(source->window), source->rows, &seen_at, &seen_id,
                                source->filter);
    source->count = rows;
    source->next = 0;
    source->exhausted = rows < source->window;
    if (source->filter != nullptr) {
        // Its mark is every topic's: known once it found a due event of any
        // topic, or read them all.
        const TopicFilter& filter = *source->filter;
        source->marks = filter.any_due || !filter.stopped;
        source->first_ready = filter.any_due ? filter.first_due : now;
    } else if (!source->read_any) {
        source->first_ready = rows > 0 ? source->rows[0].ready_at : now;
    }
    source->read_any = true;
    source->after_at = seen_at;
    source->after_id = seen_id;
    source->window = std::min(source->window * 2, kMaxWindow);
}

bool before(const ReadyRow& a, const ReadyRow& b) {
    return a.ready_at < b.ready_at || (a.ready_at == b.ready_at && a.id < b.id);
}


LockedEvents locked_events(int count) {
    return LockedEvents{static_cast<std::int64_t*>(palloc(sizeof(std::int64_t) * (count + 1))),
                        static_cast<ItemPointerData*>(palloc(sizeof(ItemPointerData) * (count + 1))),
                        static_cast<bool*>(palloc(sizeof(bool) * (count + 1)))};
}

// Records the `count` events handed out in `locked` as held by this
// claim, to be written at commit (held.hpp); returns `count`.
int hold(const ClaimRequest& request, Micros now, const LockedEvents& locked, int count) {
    if (count > 0)
        hold_events(ClaimWrite{request.relay, request.lease_until, now, request.max_attempts},
                    locked.ids, locked.versions, locked.followers, count);
    return count;
}

// The keyed heads a claim handed out, whose runs follow once it has all
// its heads (claim_ready).
struct Heads {
    RunHead* heads;  // nullptr: the claim hands out no runs
    int count;
};

// Locks and hands out up to `wanted` of the candidates (directly:
// pg/outbox/rows.hpp), records the claims to write at commit, and
// the keyed heads in `heads`; returns how many.
int hand_out(const ClaimRequest& request, Micros now, const ItemPointerData* tids, int count,
             int wanted, HandedOut sink, void* context, Heads* heads) {
    const LockedEvents locked = locked_events(wanted);
    return hold(request, now, locked,
                lock_due_events(tids, count, wanted, now, request.max_attempts, sink, context,
                                locked, heads->heads, &heads->count));
}

// The runs of the claim's keyed heads in the room its batch has left
// (pg/outbox/rows.hpp); returns how many. Heads come first: a
// claim hands out as many keys as it can, and runs fill what is left.
int hand_out_runs(const ClaimRequest& request, Micros now, const Heads& heads, int room,
                  HandedOut sink, void* context) {
    if (heads.count == 0 || room <= 0) return 0;
    const LockedEvents locked = locked_events(room);
    return hold(request, now, locked,
                lock_runs(heads.heads, heads.count, room, request.run_length, now,
                          request.max_attempts, sink, context, locked));
}

void start_source(Source* source, const text* topic, Micros after_at, std::int64_t after_id,
                  int batch) {
    source->topic = topic;
    source->marks = true;
    source->start = scan_start(topic);
    source->after_at = std::max(source->start.from, after_at);
    source->after_id = after_id;
    source->window = std::min<long>(kMaxWindow, batch + batch / 8 + 16);
}

// The claim's sources: each of its topics (`topics`; nullptr: every
// topic), or every topic kept to its own when it has many (a filtered
// source).
Source* sources_of(const ClaimRequest& request, const TopicSet* topics, int* count) {
    const bool filtered = topics != nullptr && topics->count >= kFilteredFrom;
    const int n = topics == nullptr || filtered ? 1 : topics->count;
    Source* sources = static_cast<Source*>(palloc0(sizeof(Source) * (n + 1)));
    if (filtered) {
        auto* filter = static_cast<TopicFilter*>(palloc0(sizeof(TopicFilter)));
        *filter = TopicFilter{topics, kForeignPerTopic * topics->count, 0, false, false, 0};
        start_source(&sources[0], nullptr, 0, 0, request.batch);
        sources[0].filter = filter;
    } else {
        for (int i = 0; i < n; ++i)
            start_source(&sources[i], topics != nullptr ? topics->topics[i] : nullptr, 0, 0,
                         request.batch);
    }
    *count = n;
    return sources;
}

// A filtered source passed over as many events of other topics as reading
// its topics one by one costs: it stops, and the claim goes on with a
// source per topic from where it got to (the rows it read stay to merge).
// They set no marks: events before that point held by other transactions
// were not read by them.
Source* split_filtered(Source* sources, int* count, int batch) {
    sources[0].exhausted = true;
    const TopicSet& topics = *sources[0].filter->topics;
    const int n = 1 + topics.count;
    sources = static_cast<Source*>(repalloc(sources, sizeof(Source) * (n + 1)));
    for (int i = 0; i < topics.count; ++i) {
        Source& source = sources[1 + i];
        source = Source{};
        start_source(&source, topics.topics[i], sources[0].after_at, sources[0].after_id, batch);
        source.marks = false;
    }
    *count = n;
    return sources;
}

std::uint64_t claim_ready(const ClaimRequest& request, Micros now, HandedOut sink,
                          void* context) {
    // Heads this transaction ended: their next events are ready for it too.
    promote_ended_heads(now);
    MemoryContext const caller_memory = CurrentMemoryContext;
    MemoryContext const claim_memory =
        AllocSetContextCreate(caller_memory, "idempotency outbox claim", ALLOCSET_DEFAULT_SIZES);
    MemoryContextSwitchTo(claim_memory);
    const int batch = request.batch;
    const TopicLimit& limit = request.topics;
    TopicSet topics{};
    if (limit.limited) topics = limit.set != nullptr ? *limit.set : topic_set_of(limit.topics);
    if (limit.limited && topics.count == 0) {
        MemoryContextSwitchTo(caller_memory);
        MemoryContextDelete(claim_memory);
        return 0;
    }
    int source_count = 0;
    Source* sources = sources_of(request, limit.limited ? &topics : nullptr, &source_count);
    auto* tids = static_cast<ItemPointerData*>(palloc(sizeof(ItemPointerData) * (batch + 1)));
    Holders holders;
    Heads heads{request.run_length > 1
                    ? static_cast<RunHead*>(palloc(sizeof(RunHead) * (batch + 1)))
                    : nullptr,
                0};
    int handed = 0;
    while (handed < batch) {
        // Every source with nothing left to merge reads its next window.
        bool any = false;
        for (int i = 0; i < source_count; ++i) {
            Source& source = sources[i];
            if (source.next == source.count && !(source.read_any && source.exhausted))
                read_window(&source, request, now);
            any |= source.next < source.count;
        }
        if (source_count == 1 && sources[0].filter != nullptr && sources[0].filter->stopped) {
            sources = split_filtered(sources, &source_count, batch);
            continue;
        }
        if (!any) break;
        // The candidates, oldest first, until the batch's remainder is met
        // or a source needs its next window to keep the order.
        const int wanted = batch - handed;
        int count = 0;
        while (count < wanted) {
            Source* oldest = nullptr;
            bool refill = false;
            for (int i = 0; i < source_count; ++i) {
                Source& source = sources[i];
                if (source.next == source.count) {
                    refill |= !source.exhausted;
                    continue;
                }
                if (oldest == nullptr || before(source.rows[source.next], oldest->rows[oldest->next]))
                    oldest = &source;
            }
            if (oldest == nullptr || refill) break;
            const ReadyRow& row = oldest->rows[oldest->next++];
            if (held_by_other(&holders, row.xmax) || holds(row.id)) continue;
            ItemPointerCopy(&row.ctid, &tids[count++]);
        }
        if (count > 0)
            handed += hand_out(request, now, tids, count, wanted, sink, context, &heads);
    }
    handed += hand_out_runs(request, now, heads, batch - handed, sink, context);
    for (int i = 0; i < source_count; ++i)
        if (sources[i].read_any && sources[i].marks)
            scan_found(sources[i].topic, sources[i].start, sources[i].first_ready);
    MemoryContextSwitchTo(caller_memory);
    MemoryContextDelete(claim_memory);
    return static_cast<std::uint64_t>(handed);
}

}  // namespace

std::uint64_t claim_events(const ClaimRequest& request, Micros now, HandedOut sink,
                           void* context) {
    if (!outbox_has_ready_queue()) {
        // Checks the names of a list passed in the call (a grant's own topics
        // are not an argument).
        const TopicLimit& limit = request.topics;
        if (limit.limited && limit.set == nullptr) topic_set_of(limit.topics);
        return claim_by_walking(request, now, sink, context);
    }
    return claim_ready(request, now, sink, context);
}

}  // namespace idem::pg
