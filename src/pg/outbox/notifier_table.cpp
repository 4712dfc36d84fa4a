#include "pg/outbox/notifier_table.hpp"

#include <cstdint>
#include <cstring>

extern "C" {
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

constexpr const char* kTranche = "idempotency notifiers";

struct Topic {
    bool again;  // published again since the notifier took it
    char name[kTopicBytes];
};

struct NotifierSlot {
    Oid database;    // InvalidOid: free
    bool attached;   // a notifier process owns the slot
    bool accepting;  // ... and takes pins
    bool wanted;     // a notifier should be started
    Latch* latch;    // the attached notifier's
    int pins;        // committers between their pre-commit and their publish
    int reserved;    // topic entries promised to them
    // Commits whose topics did not fit mark the slot; the marks up to
    // `overflow_sent` were notified as kAnyTopic.
    std::uint64_t overflow_marks;
    std::uint64_t overflow_sent;
    int count;
    Topic topics[kNotifierTopics];
};

struct NotifierTable {
    LWLock* lock;
    Latch* launcher_latch;
    NotifierSlot slots[kNotifierSlots];
};

NotifierTable* table = nullptr;

// The database's slot, or a free one claimed for it, or nullptr. Lock held.
NotifierSlot* slot_for(Oid database) {
    NotifierSlot* free_slot = nullptr;
    for (auto& slot : table->slots) {
        if (slot.database == database) return &slot;
        if (free_slot == nullptr && slot.database == InvalidOid) free_slot = &slot;
    }
    if (free_slot != nullptr) {
        std::memset(free_slot, 0, sizeof *free_slot);
        free_slot->database = database;
    }
    return free_slot;
}

// Adds a topic; true when the notifier must be woken for it. A topic still
// waiting for the notifier's next round needs no second wake-up: whoever
// added it woke the notifier, and that round takes it.
bool add_topic(NotifierSlot* slot, const char* name) {
    for (int i = 0; i < slot->count; ++i) {
        if (strcmp(slot->topics[i].name, name) == 0) {
            const bool was_waiting = slot->topics[i].again;
            slot->topics[i].again = true;
            return !was_waiting;
        }
    }
    // Room was reserved at the pin; the check only guards the array.
    if (slot->count == kNotifierTopics) return true;
    Topic& topic = slot->topics[slot->count++];
    topic.again = true;
    strlcpy(topic.name, name, kTopicBytes);
    return true;
}

NotifierSlot* slot_at(int index) {
    if (table == nullptr || index < 0 || index >= kNotifierSlots) return nullptr;
    return &table->slots[index];
}

}  // namespace

bool notifier_table_available() { return table != nullptr; }

Size notifier_table_size() { return MAXALIGN(sizeof(NotifierTable)); }

void request_notifier_table_lock() { RequestNamedLWLockTranche(kTranche, 1); }

void init_notifier_table() {
    bool found = false;
    table = static_cast<NotifierTable*>(
        ShmemInitStruct("idempotency notifiers", sizeof(NotifierTable), &found));
    if (!found) {
        std::memset(table, 0, sizeof *table);
        table->lock = &GetNamedLWLockTranche(kTranche)->lock;
    }
}

int pin_notifier(Oid database, int topics, bool overflowed, bool* overflow) {
    *overflow = false;
    if (table == nullptr) return -1;
    int pinned = -1;
    bool wake_launcher = false;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    if (NotifierSlot* slot = slot_for(database)) {
        if (slot->attached && slot->accepting) {
            ++slot->pins;
            if (!overflowed && slot->count + slot->reserved + topics <= kNotifierTopics)
                slot->reserved += topics;
            else
                *overflow = true;
            pinned = static_cast<int>(slot - table->slots);
        } else if (!slot->wanted) {
            // None attached, or the one attached is leaving: a successor.
            slot->wanted = true;
            wake_launcher = !slot->attached;
        }
    }
    Latch* launcher = table->launcher_latch;
    LWLockRelease(table->lock);
    if (wake_launcher && launcher != nullptr) SetLatch(launcher);
    return pinned;
}

void publish_and_unpin(int index, int reserved, const TopicList* topics, bool overflow) {
    NotifierSlot* slot = slot_at(index);
    if (slot == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    if (!overflow) slot->reserved -= reserved;
    --slot->pins;
    // An abort wakes the notifier too: a leaving one waits for the pins.
    bool wake = topics == nullptr || !slot->accepting;
    if (topics != nullptr && overflow) {
        wake |= slot->overflow_marks == slot->overflow_sent;  // else woken for the last mark
        ++slot->overflow_marks;
    } else if (topics != nullptr) {
        for (int i = 0; i < topics->count; ++i) wake |= add_topic(slot, topics->names[i]);
    }
    // The notifier died after the pin: its successor sends the topics.
    const bool orphaned =
        !slot->attached && (slot->count > 0 || slot->overflow_marks != slot->overflow_sent);
    if (orphaned) slot->wanted = true;
    Latch* latch = orphaned ? table->launcher_latch : slot->latch;
    LWLockRelease(table->lock);
    if (wake && latch != nullptr) SetLatch(latch);
}

bool attach_notifier(int index, Oid database) {
    NotifierSlot* slot = slot_at(index);
    if (slot == nullptr) return false;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    const bool ok = slot->database == database && !slot->attached;
    if (ok) {
        slot->attached = true;
        slot->accepting = true;
        slot->wanted = false;
        slot->latch = MyLatch;
    }
    LWLockRelease(table->lock);
    return ok;
}

int take_topics(int index, TopicList* out, std::uint64_t* overflow_marks) {
    NotifierSlot* slot = slot_at(index);
    out->count = 0;
    *overflow_marks = 0;
    if (slot == nullptr) return 0;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    // Overflow marks not yet notified count as one more topic: kAnyTopic.
    if (slot->overflow_marks != slot->overflow_sent) *overflow_marks = slot->overflow_marks;
    for (int i = 0; i < slot->count; ++i) {
        slot->topics[i].again = false;
        std::memcpy(out->names[i], slot->topics[i].name, kTopicBytes);
    }
    out->count = slot->count;
    LWLockRelease(table->lock);
    return out->count + (*overflow_marks != 0 ? 1 : 0);
}

void topics_sent(int index, int count, std::uint64_t overflow_marks) {
    NotifierSlot* slot = slot_at(index);
    if (slot == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    if (overflow_marks != 0) slot->overflow_sent = overflow_marks;
    int kept = 0;
    for (int i = 0; i < slot->count; ++i)
        if (i >= count || slot->topics[i].again) slot->topics[kept++] = slot->topics[i];
    slot->count = kept;
    LWLockRelease(table->lock);
}

void stop_accepting(int index) {
    NotifierSlot* slot = slot_at(index);
    if (slot == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    slot->accepting = false;
    LWLockRelease(table->lock);
}

bool try_detach(int index) {
    NotifierSlot* slot = slot_at(index);
    if (slot == nullptr) return true;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    const bool idle = slot->pins == 0 && slot->count == 0 &&
                      slot->overflow_marks == slot->overflow_sent;
    const bool successor = idle && slot->wanted;
    if (idle) {
        slot->attached = false;
        slot->accepting = false;
        slot->latch = nullptr;
        if (!successor) slot->database = InvalidOid;
    }
    Latch* launcher = table->launcher_latch;
    LWLockRelease(table->lock);
    if (successor && launcher != nullptr) SetLatch(launcher);
    return idle;
}

void detach_on_exit(int, Datum index) {
    NotifierSlot* slot = slot_at(DatumGetInt32(index));
    if (slot == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    bool successor = false;
    if (slot->attached && slot->latch == MyLatch) {
        slot->attached = false;
        slot->accepting = false;
        slot->latch = nullptr;
        successor = slot->pins > 0 || slot->count > 0 ||
                    slot->overflow_marks != slot->overflow_sent || slot->wanted;
        if (successor)
            slot->wanted = true;
        else
            slot->database = InvalidOid;
    }
    Latch* launcher = table->launcher_latch;
    LWLockRelease(table->lock);
    if (successor && launcher != nullptr) SetLatch(launcher);
}

void set_launcher_latch(Latch* latch) {
    if (table == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    table->launcher_latch = latch;
    LWLockRelease(table->lock);
}

void wanted_notifiers(Oid databases[kNotifierSlots]) {
    for (int i = 0; i < kNotifierSlots; ++i) databases[i] = InvalidOid;
    if (table == nullptr) return;
    LWLockAcquire(table->lock, LW_SHARED);
    for (int i = 0; i < kNotifierSlots; ++i) {
        const NotifierSlot& slot = table->slots[i];
        if (slot.wanted && !slot.attached) databases[i] = slot.database;
    }
    LWLockRelease(table->lock);
}

void forget_notifier_slot(int index, Oid database) {
    NotifierSlot* slot = slot_at(index);
    if (slot == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    if (slot->database == database && !slot->attached && slot->pins == 0) slot->database = InvalidOid;
    LWLockRelease(table->lock);
}

}  // namespace idem::pg
