// outbox_claim's search for due events, and the SQL it runs. Callers hold
// an SPI connection.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct ClaimRequest {
    text* relay;
    int batch;
    Micros lease_until;
    Datum topics;  // text[], when has_topics
    bool has_topics;
    int max_attempts;
};

// Receives each group of events handed out, left in SPI_tuptable as the
// outbox_delivery columns followed by whether the event's previous lease
// had run out. Groups come oldest ready first (in id order before 0.5.0).
using HandedOut = void (*)(std::uint64_t count, void* context);

// Hands out up to request.batch due events (see outbox_claim.cpp for the
// rules and how they are found, and outbox_claim_walk.cpp before 0.5.0);
// returns how many.
std::uint64_t claim_events(const ClaimRequest& request, Micros now, HandedOut sink,
                           void* context);

}  // namespace idem::pg
