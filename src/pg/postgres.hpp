// The only way the module includes PostgreSQL: every server header inside
// extern "C", and the version differences in one place.
#pragma once

extern "C" {
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

#include "core/time.hpp"

// The magic block. From PostgreSQL 18 on it also names the module and its
// version (IDEM_VERSION, the control file's default_version, comes from the
// build), shown by pg_get_loaded_modules().
#ifndef IDEM_VERSION
#error "IDEM_VERSION must be defined by the build (the control file's default_version)"
#endif
#if PG_VERSION_NUM >= 180000
#define IDEM_MODULE_MAGIC PG_MODULE_MAGIC_EXT(.name = "idempotency", .version = IDEM_VERSION)
#else
#define IDEM_MODULE_MAGIC PG_MODULE_MAGIC
#endif

namespace idem::pg {

// An interval as microseconds (a month counts 30 days, as PostgreSQL compares
// intervals). False for a value beyond int64 or, from PostgreSQL 17 on, an
// infinite interval.
inline bool interval_to_micros(const Interval* value, Micros* out) {
#if PG_VERSION_NUM >= 170000
    if (INTERVAL_NOT_FINITE(value)) return false;
#endif
    const __int128 days = static_cast<__int128>(value->month) * DAYS_PER_MONTH + value->day;
    const __int128 total = days * USECS_PER_DAY + value->time;
    if (total > INT64_MAX || total < INT64_MIN) return false;
    *out = static_cast<Micros>(total);
    return true;
}

}  // namespace idem::pg
