// Status and outcome labels against the README: the SQL enum idem_status and the
// outcome column of idem_outcome use exactly these words.
#include "core/status.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <string_view>

namespace idem {
namespace {

TEST(Status, LabelsAreTheSqlEnumValues) {
    EXPECT_STREQ(status_label(Status::Received), "RECEIVED");
    EXPECT_STREQ(status_label(Status::Processing), "PROCESSING");
    EXPECT_STREQ(status_label(Status::Completed), "COMPLETED");
    EXPECT_STREQ(status_label(Status::FailedRetryable), "FAILED_RETRYABLE");
    EXPECT_STREQ(status_label(Status::FailedFinal), "FAILED_FINAL");
}

TEST(Status, CountMatchesTheEnum) {
    EXPECT_EQ(kStatusCount, 5);
    EXPECT_EQ(static_cast<int>(Status::FailedFinal), kStatusCount - 1);
}

TEST(Status, EveryLabelRoundTrips) {
    std::set<std::string> labels;
    for (int i = 0; i < kStatusCount; ++i) {
        const Status status = static_cast<Status>(i);
        const char* label = status_label(status);
        labels.insert(label);
        const std::optional<Status> parsed = parse_status(label);
        ASSERT_TRUE(parsed.has_value()) << label;
        EXPECT_EQ(*parsed, status) << label;
    }
    EXPECT_EQ(labels.size(), static_cast<std::size_t>(kStatusCount));
}

TEST(Status, ParseIsExact) {
    for (std::string_view bad : {"", "received", "Received", "PROCESSING ", " PROCESSING",
                                 "COMPLETE", "COMPLETEDX", "FAILED", "FAILED_", "failed_final",
                                 "pending"}) {
        EXPECT_FALSE(parse_status(bad).has_value()) << '"' << bad << '"';
    }
}

TEST(Status, ParseUsesTheViewsLengthNotATerminator) {
    // Labels read from a text datum are not NUL-terminated.
    const char buffer[] = "COMPLETEDXYZ";
    EXPECT_EQ(parse_status(std::string_view(buffer, 9)), Status::Completed);
    EXPECT_FALSE(parse_status(std::string_view(buffer, 8)).has_value());
    EXPECT_FALSE(parse_status(std::string_view(buffer, 10)).has_value());
}

TEST(Outcome, LabelsAreTheSpecWords) {
    EXPECT_STREQ(outcome_label(Outcome::Registered), "registered");
    EXPECT_STREQ(outcome_label(Outcome::Claimed), "claimed");
    EXPECT_STREQ(outcome_label(Outcome::Completed), "completed");
    EXPECT_STREQ(outcome_label(Outcome::InProgress), "in_progress");
    EXPECT_STREQ(outcome_label(Outcome::RetryLater), "retry_later");
    EXPECT_STREQ(outcome_label(Outcome::Failed), "failed");
    EXPECT_STREQ(outcome_label(Outcome::Mismatch), "mismatch");
}

TEST(Outcome, LabelsAreDistinct) {
    std::set<std::string> labels;
    for (Outcome outcome : {Outcome::Registered, Outcome::Claimed, Outcome::Completed,
                            Outcome::InProgress, Outcome::RetryLater, Outcome::Failed,
                            Outcome::Mismatch})
        labels.insert(outcome_label(outcome));
    EXPECT_EQ(labels.size(), 7u);
}

}  // namespace
}  // namespace idem
