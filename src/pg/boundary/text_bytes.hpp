// Byte-wise comparisons of text values (topics, keys, relay names): the
// order the module sorts them in, not a collation's.
#pragma once

#include <algorithm>
#include <cstring>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Negative, zero or positive as a sorts before, with or after b.
inline int compare_text_bytes(const text* a, const text* b) {
    const std::size_t la = VARSIZE_ANY_EXHDR(a);
    const std::size_t lb = VARSIZE_ANY_EXHDR(b);
    const int c = std::memcmp(VARDATA_ANY(a), VARDATA_ANY(b), std::min(la, lb));
    if (c != 0) return c;
    return la < lb ? -1 : (la > lb ? 1 : 0);
}

inline bool same_text_bytes(const text* a, const text* b) {
    return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
           std::memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

}  // namespace idem::pg
