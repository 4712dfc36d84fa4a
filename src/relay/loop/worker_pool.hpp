// The delivery threads (--parallel): each owns one Sink and takes claimed
// events from a queue, one at a time or in groups (SinkTarget::group_size); results go back to the database thread, which is
// woken through the wake pipe. No libpq here.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "relay/event.hpp"
#include "relay/observe/stats.hpp"
#include "relay/sinks/sink.hpp"
#include "relay/wake.hpp"

namespace idem::relay {

class WorkerPool {
public:
    WorkerPool(SinkTarget& target, int threads, const WakePipe& wake, Stats& stats);
    ~WorkerPool();
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    // Events of one claim, in its order. Events of different keys go out
    // concurrently in any order; those of one (topic, key) (a run) one
    // after the other, in the order given, and the first that is not
    // delivered (any outcome but Ack) stops the rest of its key, which come
    // back as Skip without being tried.
    void submit(std::vector<Event>&& events);
    // Deliveries finished since the last call.
    std::vector<Delivery> take_results();
    // Events not started yet come back as Skip instead of being delivered;
    // how many were waiting to start.
    std::size_t abandon_queued();
    // Waits for the threads to finish what they are delivering, then joins.
    void stop();

private:
    void run();
    // Under mutex_: moves up to `count` queued events that may start now
    // into `taken`, and their (topic, key)s into `keys` (none of a key being
    // delivered; one per key, or with a sink whose groups keep order the
    // key's run in its order), the others keep their places.
    void take_startable(std::size_t count, std::vector<Delivery>* taken,
                        std::vector<std::string>* keys);
    bool any_startable() const;
    // Under mutex_: the deliveries `taken` finished; a key whose event was
    // not delivered has the rest of its run skipped.
    void finish(std::vector<Delivery>* taken, const std::vector<std::string>& keys);

    SinkTarget& target_;
    const WakePipe& wake_;
    Stats& stats_;
    std::mutex mutex_;
    std::condition_variable work_ready_;
    // A queued event with its (topic, key) for ordering, made once
    // (empty without a key).
    struct Queued {
        Event event;
        std::string key;
    };
    std::deque<Queued> queue_;
    // The (topic, key) of each keyed event being delivered.
    std::unordered_set<std::string> busy_keys_;
    std::vector<Delivery> results_;
    bool stopping_ = false;
    bool abandon_ = false;
    std::size_t threads_count_;
    const bool runs_in_groups_;  // the sink's groups keep order
    // One thread and groups that keep order: every queued event may start
    // (no key is busy while the thread takes), so no key is tracked.
    const bool one_ordered_thread_;
    Clock::time_point last_wake_{};
    std::vector<std::thread> threads_;
};

}  // namespace idem::relay
