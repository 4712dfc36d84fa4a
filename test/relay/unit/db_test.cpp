// The relay's database side without a database: what a failure's SQLSTATE
// means for the caller, and the text forms passed to libpq.
#include <gtest/gtest.h>

#include "relay/db/db_status.hpp"
#include "relay/db/pg_text.hpp"

using namespace idem::relay;

TEST(RelayDbStatus, ALostConnectionOrAStandbyMeansReconnect) {
    EXPECT_EQ(classify_failure(nullptr, true), DbStatus::Lost);    // no SQLSTATE: it broke
    EXPECT_EQ(classify_failure("42501", false), DbStatus::Lost);   // whatever it says
    EXPECT_EQ(classify_failure("08006", true), DbStatus::Lost);    // connection failure
    EXPECT_EQ(classify_failure("57P01", true), DbStatus::Lost);    // admin shutdown
    EXPECT_EQ(classify_failure("25006", true), DbStatus::Lost);    // read-only: a standby
}

TEST(RelayDbStatus, ConflictsTimeoutsAndShortagesAreTriedAgain) {
    for (const char* state : {"40001", "40P01", "55P03", "57014", "53300", "58030"})
        EXPECT_EQ(classify_failure(state, true), DbStatus::Transient) << state;
}

TEST(RelayDbStatus, AnythingElseIsFatal) {
    for (const char* state : {"42501", "42883", "3F000", "22023", "IK002", "57000", "25P02"})
        EXPECT_EQ(classify_failure(state, true), DbStatus::Fatal) << state;
}

TEST(RelayPgText, ArrayLiterals) {
    EXPECT_EQ(array_literal({}), "{}");
    EXPECT_EQ(array_literal({"a", "b c", "q\"u\\o"}), "{\"a\",\"b c\",\"q\\\"u\\\\o\"}");
    EXPECT_EQ(id_array({}), "{}");
    EXPECT_EQ(id_array({1, -2, 9007199254740993}), "{1,-2,9007199254740993}");
}

TEST(RelayPgText, Doubles) {
    EXPECT_DOUBLE_EQ(parse_double("1764858123.123456"), 1764858123.123456);
    EXPECT_DOUBLE_EQ(parse_double("-0.5"), -0.5);
    EXPECT_DOUBLE_EQ(parse_double("1e+20"), 1e20);
    EXPECT_DOUBLE_EQ(parse_double("42"), 42.0);
    EXPECT_EQ(parse_double(""), 0.0);
    EXPECT_EQ(parse_double("x"), 0.0);
}

TEST(RelayPgText, OneLine) {
    EXPECT_EQ(one_line(nullptr), "");
    EXPECT_EQ(one_line("ERROR:  boom\nDETAIL:\tmore\n \n"), "ERROR:  boom DETAIL: more");
}
