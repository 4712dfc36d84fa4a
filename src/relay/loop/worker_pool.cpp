#include "relay/loop/worker_pool.hpp"

#include <algorithm>
#include <iterator>
#include <system_error>

namespace idem::relay {

namespace {

// Results are handed back in groups so that one outbox_ack covers many of
// them: the database thread is woken when the queue runs dry, when many
// results wait, or every 2 ms.
constexpr std::size_t kWakeAfterResults = 64;
constexpr auto kWakeInterval = std::chrono::milliseconds(2);

// An event's key for ordering: (topic, key), or empty without a key.
std::string order_key(const Event& event) {
    if (!event.key) return {};
    std::string both = event.topic;
    both.push_back('\0');
    both += *event.key;
    return both;
}

}  // namespace

bool WorkerPool::any_startable() const {
    for (const Queued& queued : queue_)
        if (queued.key.empty() || busy_keys_.count(queued.key) == 0) return true;
    return false;
}

void WorkerPool::take_startable(std::size_t count, std::vector<Delivery>* taken,
                                std::vector<std::string>* keys) {
    if (one_ordered_thread_) {
        // Nothing is being delivered while the only thread takes, and a
        // key's run may share a group: the first `count` events start.
        for (; !queue_.empty() && taken->size() < count; queue_.pop_front()) {
            taken->push_back(Delivery{std::move(queue_.front().event), {}, 0});
            keys->push_back(std::move(queue_.front().key));
        }
        return;
    }
    std::deque<Queued> kept;
    std::unordered_set<std::string> runs;  // keys this take started
    auto next = queue_.begin();
    for (; next != queue_.end() && taken->size() < count; ++next) {
        bool start = next->key.empty();
        if (!start && busy_keys_.insert(next->key).second) {
            start = true;
            if (runs_in_groups_) runs.insert(next->key);
        } else if (!start && runs.count(next->key) > 0) {
            start = true;  // the next of a run this group holds
        }
        if (start) {
            taken->emplace_back();
            taken->back().event = std::move(next->event);
            keys->push_back(std::move(next->key));
        } else {
            kept.push_back(std::move(*next));
        }
    }
    // Past the events taken, the queue keeps its order as it is.
    std::move(next, queue_.end(), std::back_inserter(kept));
    queue_.swap(kept);
}

void WorkerPool::finish(std::vector<Delivery>* taken, const std::vector<std::string>& keys) {
    for (std::size_t i = 0; i < taken->size(); ++i) {
        const Delivery& delivery = (*taken)[i];
        const std::string& key = keys[i];
        if (key.empty()) continue;
        if (!one_ordered_thread_) busy_keys_.erase(key);
        if (delivery.outcome.verdict == Verdict::Ack) continue;
        // The rest of its run waits behind it in the outbox: not tried. An
        // event not tried either (a broker that blocks publishing) gives them
        // its reason, the one that holds for them too.
        const std::string why = delivery.outcome.verdict == Verdict::Skip
                                    ? delivery.outcome.error
                                    : "an earlier event of its key was not delivered";
        std::deque<Queued> kept;
        for (Queued& queued : queue_) {
            if (queued.key != key) {
                kept.push_back(std::move(queued));
                continue;
            }
            Delivery stopped;
            stopped.event = std::move(queued.event);
            stopped.outcome = Outcome::skip(why);
            results_.push_back(std::move(stopped));
        }
        queue_.swap(kept);
    }
    for (Delivery& delivery : *taken) results_.push_back(std::move(delivery));
}

WorkerPool::WorkerPool(SinkTarget& target, int threads, const WakePipe& wake, Stats& stats)
    : target_(target), wake_(wake), stats_(stats),
      threads_count_(static_cast<std::size_t>(std::max(1, threads))),
      runs_in_groups_(target.groups_keep_order() && target.group_size() > 1),
      one_ordered_thread_(runs_in_groups_ && threads_count_ == 1) {
    threads_.reserve(static_cast<std::size_t>(threads));
    try {
        for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
    } catch (const std::system_error&) {
        stop();  // no thread may outlive a pool that was never made
        throw;
    }
}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::submit(std::vector<Event>&& events) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (Event& event : events) {
            std::string key = order_key(event);
            queue_.push_back(Queued{std::move(event), std::move(key)});
        }
    }
    work_ready_.notify_all();
}

std::vector<Delivery> WorkerPool::take_results() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Delivery> taken;
    // results_ goes on with room for as many, not growing from none again.
    taken.reserve(results_.capacity());
    taken.swap(results_);
    return taken;
}

std::size_t WorkerPool::abandon_queued() {
    std::size_t queued;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        abandon_ = true;
        queued = queue_.size();
    }
    work_ready_.notify_all();
    return queued;
}

void WorkerPool::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    work_ready_.notify_all();
    for (std::thread& thread : threads_)
        if (thread.joinable()) thread.join();
    threads_.clear();
}

// Takes up to the sink's group size of the queued events at a time, shared
// out among the threads so that none idles while another holds many.
void WorkerPool::run() {
    std::unique_ptr<Sink> sink = target_.open();
    const Millis longest = target_.max_delivery_time();
    const std::size_t group_size = std::max<std::size_t>(1, target_.group_size());
    const std::size_t threads = threads_count_;
    std::vector<Delivery> taken;
    std::vector<std::string> keys;  // taken[i]'s (topic, key), empty without one
    std::vector<const Event*> group;
    std::vector<std::size_t> slots;
    std::vector<Outcome> outcomes;
    std::unordered_set<std::string> stopped;  // keys of the group with an event not sent
    for (;;) {
        bool abandon;
        taken.clear();
        keys.clear();
        {
            std::unique_lock<std::mutex> lock(mutex_);
            work_ready_.wait(lock, [this] { return stopping_ || any_startable(); });
            if (!any_startable()) {
                if (queue_.empty()) return;
                // Stopping: the events left wait for their keys' deliveries.
                work_ready_.wait(lock, [this] { return queue_.empty() || any_startable(); });
                if (queue_.empty()) return;
            }
            const std::size_t share = (queue_.size() + threads - 1) / threads;
            const std::size_t count = std::min(group_size, std::max<std::size_t>(1, share));
            take_startable(count, &taken, &keys);
            abandon = abandon_;
        }
        const Clock::time_point start = Clock::now();
        group.clear();
        slots.clear();
        stopped.clear();
        for (std::size_t i = 0; i < taken.size(); ++i) {
            Delivery& delivery = taken[i];
            const std::string& key = keys[i];
            if (abandon) {
                delivery.outcome = Outcome::skip("the relay is stopping");
            } else if (!key.empty() && stopped.count(key) > 0) {
                delivery.outcome = Outcome::skip("an earlier event of its key was not delivered");
            } else if (start + longest >= delivery.event.lease_until) {
                // Delivering now could outlive the lease and race another relay.
                delivery.outcome = Outcome::skip("its lease would run out during the delivery");
                if (!key.empty()) stopped.insert(key);
            } else {
                group.push_back(&delivery.event);
                slots.push_back(i);
            }
        }
        if (!group.empty()) {
            if (group.size() == 1) {
                outcomes.assign(1, sink->deliver(*group.front()));
            } else {
                sink->deliver_group(group, &outcomes);
            }
            const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
            // Each event's share of the group's time: what one delivery costs.
            const double share = seconds / static_cast<double>(group.size());
            for (std::size_t j = 0; j < slots.size(); ++j) {
                Delivery& delivery = taken[slots[j]];
                delivery.outcome = j < outcomes.size() ? std::move(outcomes[j])
                                                       : Outcome::retry("the sink gave no outcome");
                delivery.seconds = share;
                stats_.delivery_seconds.observe(seconds);
            }
        }
        bool wake;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            finish(&taken, keys);
            const Clock::time_point now = Clock::now();
            wake = queue_.empty() || results_.size() >= kWakeAfterResults ||
                   now - last_wake_ >= kWakeInterval;
            if (wake) last_wake_ = now;
        }
        // Keys freed: events of theirs may start on another thread.
        work_ready_.notify_all();
        if (wake) wake_.notify();
    }
}

}  // namespace idem::relay
