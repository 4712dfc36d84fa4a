// The inbox (idempotency.inbox): inbox_receive, and its retention purge.
#pragma once

#include <cstdint>

namespace idem::pg {

// Deletes at most `batch` rows past idempotency.inbox_retention; how many.
std::uint64_t purge_inbox(int batch);

}  // namespace idem::pg
