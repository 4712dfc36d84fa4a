#include "relay/loop/settle_queues.hpp"

#include <algorithm>

namespace idem::relay {

namespace {

// Moves the deliveries that match out of from, into to; the others keep
// their order.
template <typename Match>
void move_if(std::vector<Delivery>& from, std::vector<Delivery>& to, Match match) {
    std::vector<Delivery> kept;
    kept.reserve(from.size());
    for (Delivery& d : from) {
        if (match(d)) to.push_back(std::move(d));
        else kept.push_back(std::move(d));
    }
    from.swap(kept);
}

void append(std::vector<Delivery>& to, std::vector<Delivery>& from) {
    if (to.empty()) {
        // Taken whole; `from` fills again with room for as many.
        to.swap(from);
        from.reserve(to.size());
        return;
    }
    to.reserve(to.size() + from.size());
    for (Delivery& d : from) to.push_back(std::move(d));
    from.clear();
}

}  // namespace

void SettleQueues::hold(Delivery&& delivery, std::chrono::milliseconds lease) {
    const Clock::time_point until = delivery.event.lease_until - lease / 2;
    held_until = held.empty() ? until : std::min(held_until, until);
    held.push_back(std::move(delivery));
}

void SettleQueues::nack_held() { append(to_nack, held); }

void SettleQueues::release_held() { append(to_release, held); }

CommitBatch SettleQueues::take_for_commit(std::uint64_t txn, Clock::time_point now,
                                          bool can_release) {
    CommitBatch batch;
    append(batch.acks, to_ack);
    move_if(to_nack, batch.nacks, [txn](const Delivery& d) { return d.event.txn == txn; });
    if (can_release)
        move_if(to_release, batch.releases, [txn, now](const Delivery& d) {
            return d.event.txn == txn || now < d.event.lease_until;
        });
    return batch;
}

CommitBatch SettleQueues::give_back(CommitBatch&& batch, std::uint64_t txn) {
    CommitBatch dropped;
    auto of_txn = [txn](const Delivery& d) { return d.event.txn == txn; };
    move_if(batch.acks, dropped.acks, of_txn);
    append(to_ack, batch.acks);
    append(dropped.nacks, batch.nacks);
    move_if(batch.releases, dropped.releases, of_txn);
    append(to_release, batch.releases);
    return dropped;
}

std::vector<Delivery> SettleQueues::drop(std::uint64_t txn, std::size_t* acks) {
    std::vector<Delivery> dropped;
    auto of_txn = [txn](const Delivery& d) { return d.event.txn == txn; };
    move_if(to_ack, dropped, of_txn);
    *acks = dropped.size();
    move_if(to_nack, dropped, of_txn);
    move_if(to_release, dropped, of_txn);
    move_if(held, dropped, of_txn);
    return dropped;
}

}  // namespace idem::relay
