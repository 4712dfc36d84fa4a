// The claim of an outbox laid out before 0.5.0 (no ready queue): one walk
// over the live events of the claimed topics in id order. Callers hold an
// SPI connection.
#pragma once

#include "pg/outbox/claim.hpp"

namespace idem::pg {

std::uint64_t claim_by_walking(const ClaimRequest& request, Micros now, HandedOut sink,
                               void* context);

}  // namespace idem::pg
