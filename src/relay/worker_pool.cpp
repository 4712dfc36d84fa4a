#include "relay/worker_pool.hpp"

namespace idem::relay {

namespace {

// Results are handed back in groups so that one outbox_ack covers many of
// them: the database thread is woken when the queue runs dry, when many
// results wait, or every 2 ms.
constexpr std::size_t kWakeAfterResults = 64;
constexpr auto kWakeInterval = std::chrono::milliseconds(2);

}  // namespace

WorkerPool::WorkerPool(SinkTarget& target, int threads, const WakePipe& wake, Stats& stats)
    : target_(target), wake_(wake), stats_(stats) {
    threads_.reserve(static_cast<std::size_t>(threads));
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::submit(std::vector<Event>&& events) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (Event& event : events) queue_.push_back(std::move(event));
    }
    work_ready_.notify_all();
}

std::vector<Delivery> WorkerPool::take_results() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Delivery> taken;
    taken.swap(results_);
    return taken;
}

void WorkerPool::abandon_queued() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        abandon_ = true;
    }
    work_ready_.notify_all();
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

void WorkerPool::run() {
    std::unique_ptr<Sink> sink = target_.open();
    const Millis longest = target_.max_delivery_time();
    for (;;) {
        Delivery delivery;
        bool abandon;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            delivery.event = std::move(queue_.front());
            queue_.pop_front();
            abandon = abandon_;
        }
        const Clock::time_point start = Clock::now();
        if (abandon) {
            delivery.outcome = Outcome::skip("the relay is stopping");
        } else if (start + longest >= delivery.event.lease_until) {
            // Delivering now could outlive the lease and race another relay.
            delivery.outcome = Outcome::skip("its lease would run out during the delivery");
        } else {
            delivery.outcome = sink->deliver(delivery.event);
            delivery.seconds = std::chrono::duration<double>(Clock::now() - start).count();
            stats_.delivery_seconds.observe(delivery.seconds);
        }
        bool wake;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            results_.push_back(std::move(delivery));
            const Clock::time_point now = Clock::now();
            wake = queue_.empty() || results_.size() >= kWakeAfterResults ||
                   now - last_wake_ >= kWakeInterval;
            if (wake) last_wake_ = now;
        }
        if (wake) wake_.notify();
    }
}

}  // namespace idem::relay
