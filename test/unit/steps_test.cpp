// check_step_name, decide_step and step_sqlstate against the rules of
// idem_step (docs/keys.md, "Multi-step work"): a step's name is 1 to 63
// bytes of ASCII letters, digits and _ . : -; a result over
// idempotency.max_step_bytes is 22001; a repeated name is IK004 before the
// limit; a key that holds idempotency.max_steps steps takes no more (54000).
#include "core/steps.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/error.hpp"

namespace idem {
namespace {

std::string name_error(const std::string& name) {
    try {
        check_step_name(name.data(), name.size());
    } catch (const Error& e) {
        return std::string(e.sqlstate()) + ": " + e.what();
    }
    return "ok";
}

TEST(CheckStepName, AcceptsTheNamesOfTheDocs) {
    for (const char* name : {"reserve", "charge", "send-email", "stock.reserve", "item:3", "a",
                             "Charge_2", "0"})
        EXPECT_EQ(name_error(name), "ok") << name;
}

TEST(CheckStepName, EmptyIsInvalid) {
    EXPECT_EQ(name_error(""), "22023: step must not be empty");
}

TEST(CheckStepName, LengthIsCountedInBytesUpTo63) {
    EXPECT_EQ(name_error(std::string(63, 'x')), "ok");
    EXPECT_EQ(name_error(std::string(64, 'x')), "22001: step must be at most 63 bytes long (it has 64)");
    EXPECT_EQ(name_error(std::string(100000, 'x')).substr(0, 6), "22001:");
}

TEST(CheckStepName, OtherCharactersAreRefusedWithTheirPlace) {
    EXPECT_EQ(name_error("charge card"),
              "22023: step must hold only ASCII letters, digits and _ . : - (byte 7 is not one "
              "of them)");
    for (const char* name : {"a/b", "a\tb", "a\nb", "caf\xc3\xa9", "a\"b", "a=b", " ", "a,b",
                             "\x7f"})
        EXPECT_EQ(name_error(name).substr(0, 6), "22023:") << name;
}

TEST(CheckStepName, ANulByteIsNotPartOfAName) {
    const char name[] = {'a', '\0', 'b'};
    try {
        check_step_name(name, sizeof name);
        FAIL() << "accepted";
    } catch (const Error& e) {
        EXPECT_STREQ(e.sqlstate(), "22023");
    }
}

TEST(CheckStepResultSize, UpToTheLimitInBytes) {
    EXPECT_NO_THROW(check_step_result_size("charge", 0, 100));
    EXPECT_NO_THROW(check_step_result_size("charge", 100, 100));
    try {
        check_step_result_size("charge", 101, 100);
        FAIL() << "accepted";
    } catch (const Error& e) {
        EXPECT_STREQ(e.sqlstate(), "22001");
        EXPECT_STREQ(e.what(),
                     "the result of step \"charge\" must be at most 100 bytes "
                     "(idempotency.max_step_bytes); it has 101");
    }
}

TEST(DecideStep, RecordsWhileUnderTheLimit) {
    for (int recorded : {0, 1, 2}) EXPECT_EQ(decide_step(recorded, false, 3), StepVerdict::Record);
}

TEST(DecideStep, TheLastStepAllowedIsTheMaxth) {
    EXPECT_EQ(decide_step(2, false, 3), StepVerdict::Record);
    EXPECT_EQ(decide_step(3, false, 3), StepVerdict::TooMany);
    EXPECT_EQ(decide_step(1000, false, 3), StepVerdict::TooMany);
    EXPECT_EQ(decide_step(0, false, 1), StepVerdict::Record);
    EXPECT_EQ(decide_step(1, false, 1), StepVerdict::TooMany);
}

TEST(DecideStep, ARepeatedNameIsReportedBeforeTheLimit) {
    EXPECT_EQ(decide_step(1, true, 3), StepVerdict::Duplicate);
    EXPECT_EQ(decide_step(3, true, 3), StepVerdict::Duplicate);
}

TEST(StepSqlstate, EachRefusalHasItsCode) {
    EXPECT_STREQ(step_sqlstate(StepVerdict::Duplicate), "IK004");
    EXPECT_STREQ(step_sqlstate(StepVerdict::TooMany), "54000");
    EXPECT_STREQ(step_sqlstate(StepVerdict::Record), "XX000");
}

}  // namespace
}  // namespace idem
