// The argument checks that apply to every function (README, "Error codes"):
// NULL -> 22004; empty name, bad interval or batch -> 22023; too long ->
// 22001; lengths in bytes; messages name the argument and the limit.
// Also the core's Error type, which carries the SQLSTATE to the boundary.
#include "core/validate.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace idem {
namespace {

constexpr std::size_t kMaxValueBytes = 1024 * 1024;  // idempotency.max_value_bytes default (1MB)
constexpr Micros kMaxLease = kDay;                   // idempotency.max_lease default (1 day)

// Runs `check`, expects idem::Error with `sqlstate`, and that its message
// contains every one of `words`.
void expect_error(const std::function<void()>& check, const char* sqlstate,
                  const std::vector<std::string>& words) {
    try {
        check();
    } catch (const Error& error) {
        EXPECT_STREQ(error.sqlstate(), sqlstate) << error.what();
        const std::string message = error.what();
        for (const std::string& word : words)
            EXPECT_NE(message.find(word), std::string::npos)
                << "message \"" << message << "\" lacks \"" << word << "\"";
        return;
    } catch (...) {
        ADD_FAILURE() << "threw something other than idem::Error";
        return;
    }
    ADD_FAILURE() << "no error; expected SQLSTATE " << sqlstate;
}

std::string duration(Micros value) {
    char out[64];
    format_duration(value, out, sizeof out);
    return out;
}

// ---------------------------------------------------------------- limits

TEST(Limits, MatchTheSpec) {
    EXPECT_EQ(kMaxNameBytes, 255u);
    EXPECT_EQ(kMaxScopeBytes, 63u);
    EXPECT_EQ(kMaxBatch, 10000);
    // interval '100 years' is 1200 months; PostgreSQL counts a month as 30 days.
    EXPECT_EQ(kHundredYears, Micros{36000} * 86400 * 1000000);
}

// ----------------------------------------------------------------- NULLs

TEST(NullArgument, Is22004AndNamesTheArgument) {
    for (const char* name : {"key", "scope", "token", "topic", "payload"})
        expect_error([&] { throw_null_argument(name); }, "22004", {name});
}

// ----------------------------------------------------------------- names

TEST(CheckName, EmptyIs22023) {
    expect_error([] { check_name("key", 0); }, "22023", {"key"});
    expect_error([] { check_name("scope", 0, kMaxScopeBytes); }, "22023", {"scope"});
}

TEST(CheckName, UpToTheLimitIsAccepted) {
    EXPECT_NO_THROW(check_name("key", 1));
    EXPECT_NO_THROW(check_name("key", 255));
    EXPECT_NO_THROW(check_name("scope", 63, kMaxScopeBytes));
}

TEST(CheckName, OneByteOverIs22001NamingTheLimit) {
    expect_error([] { check_name("key", 256); }, "22001", {"key", "255"});
    expect_error([] { check_name("message_id", 100000); }, "22001", {"message_id", "255"});
    expect_error([] { check_name("scope", 64, kMaxScopeBytes); }, "22001", {"scope", "63"});
}

TEST(CheckName, EmptyWinsOverEveryLimit) {
    // An empty name is never "too long", whatever the limit.
    expect_error([] { check_name("key", 0, 0); }, "22023", {"key"});
}

TEST(CheckOptionalName, EmptyIsAccepted) {
    EXPECT_NO_THROW(check_optional_name("dedup_key", 0));
    EXPECT_NO_THROW(check_optional_name("dedup_key", 255));
}

TEST(CheckOptionalName, TooLongIs22001NamingTheLimit) {
    expect_error([] { check_optional_name("dedup_key", 256); }, "22001", {"dedup_key", "255"});
    expect_error([] { check_optional_name("job_ref", 300, 100); }, "22001", {"job_ref", "100"});
}

// ---------------------------------------------------------------- values

TEST(CheckValueSize, UpToTheLimitIsAccepted) {
    EXPECT_NO_THROW(check_value_size("result", 0, kMaxValueBytes));
    EXPECT_NO_THROW(check_value_size("result", kMaxValueBytes, kMaxValueBytes));
}

TEST(CheckValueSize, LargerIs22001NamingTheArgumentTheLimitAndTheSetting) {
    expect_error([] { check_value_size("result", kMaxValueBytes + 1, kMaxValueBytes); }, "22001",
                 {"result", "1048576", "idempotency.max_value_bytes"});
    expect_error([] { check_value_size("error", 11, 10); }, "22001", {"error", "10"});
    expect_error([] { check_value_size("payload", SIZE_MAX, kMaxValueBytes); }, "22001",
                 {"payload"});
}

// -------------------------------------------------- lease, extend, ttl, wait

TEST(CheckPositiveInterval, PositiveUpToTheMaxIsAccepted) {
    EXPECT_NO_THROW(check_positive_interval("lease", 1, kMaxLease, "idempotency.max_lease"));
    EXPECT_NO_THROW(check_positive_interval("lease", 30 * kSecond, kMaxLease,
                                            "idempotency.max_lease"));
    EXPECT_NO_THROW(check_positive_interval("lease", kMaxLease, kMaxLease,
                                            "idempotency.max_lease"));
}

TEST(CheckPositiveInterval, ZeroNegativeOrAboveTheMaxIs22023NamingTheLimit) {
    for (Micros bad : {Micros{0}, Micros{-1}, -kDay, std::numeric_limits<Micros>::min(),
                       kMaxLease + 1, 2 * kMaxLease, std::numeric_limits<Micros>::max()}) {
        SCOPED_TRACE(bad);
        expect_error([&] { check_positive_interval("extend", bad, kMaxLease,
                                                   "idempotency.max_lease"); },
                     "22023", {"extend", "idempotency.max_lease", "1 day"});
    }
}

TEST(CheckPositiveInterval, MessageShowsTheMaxInForce) {
    expect_error([] { check_positive_interval("ttl", 2 * kHundredYears, 90 * kSecond, "max"); },
                 "22023", {"ttl", "90 s"});
}

// ----------------------------------------------------------- retain, retry_in

TEST(CheckNonnegativeInterval, ZeroUpToHundredYearsIsAccepted) {
    EXPECT_NO_THROW(check_nonnegative_interval("retain", 0));
    EXPECT_NO_THROW(check_nonnegative_interval("retain", 1));
    EXPECT_NO_THROW(check_nonnegative_interval("retry_in", kHundredYears));
}

TEST(CheckNonnegativeInterval, NegativeOrAboveHundredYearsIs22023) {
    for (Micros bad : {Micros{-1}, -kDay, std::numeric_limits<Micros>::min(), kHundredYears + 1,
                       std::numeric_limits<Micros>::max()}) {
        SCOPED_TRACE(bad);
        expect_error([&] { check_nonnegative_interval("retry_in", bad); }, "22023",
                     {"retry_in", "100 years"});
    }
}

// ---------------------------------------------------------------- batch

TEST(CheckBatch, OneToTenThousandIsAccepted) {
    EXPECT_NO_THROW(check_batch("batch", 1));
    EXPECT_NO_THROW(check_batch("batch", 100));
    EXPECT_NO_THROW(check_batch("batch", 10000));
}

TEST(CheckBatch, OutsideIs22023NamingTheLimits) {
    for (std::int64_t bad : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{10001},
                             std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::min(),
                             std::numeric_limits<std::int64_t>::max()}) {
        SCOPED_TRACE(bad);
        expect_error([&] { check_batch("batch", bad); }, "22023", {"batch", "1", "10000"});
    }
}

// ------------------------------------------------------- format_duration

TEST(FormatDuration, UsesTheLargestExactUnit) {
    EXPECT_EQ(duration(kDay), "1 day");
    EXPECT_EQ(duration(2 * kDay), "2 days");
    EXPECT_EQ(duration(kHundredYears), "36000 days");
    EXPECT_EQ(duration(3600 * kSecond), "1 hour");
    EXPECT_EQ(duration(36 * 3600 * kSecond), "36 hours");
    EXPECT_EQ(duration(5 * 60 * kSecond), "5 min");
    EXPECT_EQ(duration(90 * kSecond), "90 s");
    EXPECT_EQ(duration(kSecond), "1 s");
    EXPECT_EQ(duration(30 * kSecond), "30 s");
    EXPECT_EQ(duration(1500 * kMillisecond), "1500 ms");
    EXPECT_EQ(duration(kMillisecond), "1 ms");
    EXPECT_EQ(duration(1), "1 us");
    EXPECT_EQ(duration(1001), "1001 us");
}

TEST(FormatDuration, ZeroAndNegativeStillSaySomething) {
    EXPECT_EQ(duration(0), "0 us");
    EXPECT_EQ(duration(-5), "-5 us");
    EXPECT_EQ(duration(std::numeric_limits<Micros>::max()),
              std::to_string(std::numeric_limits<Micros>::max()) + " us");
}

TEST(FormatDuration, SmallBufferIsTruncatedAndTerminated) {
    char out[6];
    std::memset(out, 'x', sizeof out);
    format_duration(36 * 3600 * kSecond, out, sizeof out);
    EXPECT_EQ(std::string(out), "36 ho");
}

// ----------------------------------------------------------------- Error

TEST(Error, CarriesTheSqlstateAndTheMessage) {
    const Error error("IK002", "idempotency key \"k\" does not exist");
    EXPECT_STREQ(error.sqlstate(), "IK002");
    EXPECT_STREQ(error.what(), "idempotency key \"k\" does not exist");
    const std::exception& base = error;  // caught as std::exception at the boundary
    EXPECT_STREQ(base.what(), "idempotency key \"k\" does not exist");
}

TEST(Error, SqlstateIsFiveCharacters) {
    const Error error("22023extra", "m");
    EXPECT_STREQ(error.sqlstate(), "22023");
}

TEST(Error, SpecCodes) {
    EXPECT_STREQ(sqlstate::null_value, "22004");
    EXPECT_STREQ(sqlstate::invalid_parameter, "22023");
    EXPECT_STREQ(sqlstate::too_long, "22001");
    EXPECT_STREQ(sqlstate::stale_token, "IK001");
    EXPECT_STREQ(sqlstate::no_such_key, "IK002");
    EXPECT_STREQ(sqlstate::wrong_state, "IK003");
}

}  // namespace
}  // namespace idem
