// Included last by every file of the core: the core is plain C++17 and
// must not see PostgreSQL's headers (their macros and longjmp-based errors
// do not mix with exceptions and destructors). A server header reached
// through any include above stops the build here.
#pragma once

#if defined(POSTGRES_H) || defined(PG_VERSION_NUM)
static_assert(false, "src/core must not include PostgreSQL server headers");
#endif
