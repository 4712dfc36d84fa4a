// outbox_claim's search for due events. Callers hold an SPI connection.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"
#include "pg/outbox/topic_set.hpp"

namespace idem::pg {

struct ClaimRequest {
    text* relay;
    int batch;
    Micros lease_until;
    TopicLimit topics;
    int max_attempts;
    int run_length;  // events of one key handed out together, the head first (1: the head alone)
};

// One event handed out: its outbox_delivery columns (valid during the
// call), and whether its previous lease had run out.
struct HandedOutEvent {
    static constexpr int kColumns = 8;
    Datum values[kColumns];
    bool nulls[kColumns];
    bool lease_ran_out;
};
// Receives each event handed out, oldest ready first (in id order before
// 0.5.0).
using HandedOut = void (*)(const HandedOutEvent& event, void* context);

// Hands out up to request.batch due events (see claim.cpp for the
// rules and how they are found, and claim_walk.cpp before 0.5.0);
// returns how many.
std::uint64_t claim_events(const ClaimRequest& request, Micros now, HandedOut sink,
                           void* context);

}  // namespace idem::pg
