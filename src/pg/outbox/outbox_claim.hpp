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

struct Statement;

// Runs `hand_out` (a statement of the candidates' row versions $1, now $2,
// the attempt cap $3, how many $4 and the ids this transaction holds $5),
// passes the rows to `sink`, records the claims to write at commit
// (outbox_held.hpp), and returns how many; *last, when given, gets the
// greatest id handed out.
std::uint64_t hand_out_candidates(Statement& hand_out, const ClaimRequest& request, Micros now,
                                  Datum* versions, int count, int wanted, HandedOut sink,
                                  void* context, Datum* last);

}  // namespace idem::pg
