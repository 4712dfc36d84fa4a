// An outbox event as the relay handles it, and what became of its delivery.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace idem::relay {

using Clock = std::chrono::steady_clock;

// One row of idempotency.outbox_claim().
struct Event {
    std::int64_t id = 0;
    std::string topic;
    std::optional<std::string> key;
    std::string payload;                 // jsonb text
    std::optional<std::string> headers;  // jsonb text of an object
    std::optional<std::string> dedup_key;
    int attempt = 0;
    double enqueued_at = 0;              // seconds since the epoch
    Clock::time_point lease_until;       // when our claim runs out (local clock)
    std::int64_t claimed_bytes = 0;      // payload and headers as the claim measured them
    bool sent = true;                    // payload and headers fetched (not past the claim's
                                         // byte budget)
    std::uint64_t txn = 0;               // the relay's number of the claim's transaction

    std::int64_t bytes() const {
        return static_cast<std::int64_t>(payload.size() + (headers ? headers->size() : 0));
    }
};

enum class Verdict {
    Ack,    // the sink has it: outbox_ack
    Retry,  // try again later: outbox_nack(retryable => true)
    Dead,   // never deliverable: outbox_nack(retryable => false)
    Skip,   // not attempted (its lease would run out first, the relay is stopping):
            // released back to pending without counting an attempt
};

struct Outcome {
    Verdict verdict = Verdict::Retry;
    std::string error;                     // for Retry and Dead
    std::optional<std::int64_t> retry_in;  // milliseconds, when the sink asked (Retry-After)
    long status = 0;                       // the HTTP status, when there was one
    bool duplicate = false;                // acked: the broker had it already (a repeat)

    static Outcome ack(long status = 0) { return Outcome{Verdict::Ack, {}, {}, status}; }
    static Outcome retry(std::string error, std::optional<std::int64_t> retry_in = {},
                         long status = 0) {
        return Outcome{Verdict::Retry, std::move(error), retry_in, status};
    }
    static Outcome dead(std::string error, long status = 0) {
        return Outcome{Verdict::Dead, std::move(error), {}, status};
    }
    static Outcome skip(std::string why) { return Outcome{Verdict::Skip, std::move(why), {}, 0}; }
};

// A finished delivery, on its way back to the database thread.
struct Delivery {
    Event event;
    Outcome outcome;
    double seconds = 0;  // time the sink took
};

}  // namespace idem::relay
