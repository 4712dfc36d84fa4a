// What idem-relay sends and how it reads answers: JSON, the stdout line,
// HTTP statuses and Retry-After, reconnect backoff.
#include <gtest/gtest.h>

#include "relay/json.hpp"
#include "relay/loop/reconnect_backoff.hpp"
#include "relay/sinks/http_outcome.hpp"
#include "relay/sinks/stdout_sink.hpp"

using namespace idem::relay;

TEST(RelayJson, StringEscapes) {
    std::string out;
    append_json_string(out, "a\"b\\c\nd\te\x01 \xc3\xa9");
    EXPECT_EQ(out, "\"a\\\"b\\\\c\\nd\\te\\u0001 \xc3\xa9\"");
}

TEST(RelayJson, ObjectMembers) {
    JsonMembers m;
    ASSERT_TRUE(parse_json_object(R"({"a": "x\"y", "n": 5, "o": {"k": [1, {"z": null}]}, "t": true})", &m));
    ASSERT_EQ(m.size(), 4u);
    EXPECT_EQ(m[0], (std::pair<std::string, std::string>{"a", "x\"y"}));
    EXPECT_EQ(m[1], (std::pair<std::string, std::string>{"n", "5"}));
    EXPECT_EQ(m[2], (std::pair<std::string, std::string>{"o", R"({"k": [1, {"z": null}]})"}));
    EXPECT_EQ(m[3], (std::pair<std::string, std::string>{"t", "true"}));
    ASSERT_TRUE(parse_json_object("{}", &m));
    EXPECT_TRUE(m.empty());
    ASSERT_TRUE(parse_json_object(R"({"u": "\u00e9\ud83d\ude00\n"})", &m));
    EXPECT_EQ(m[0].second, "\xc3\xa9\xf0\x9f\x98\x80\n");
}

TEST(RelayJson, NotAnObject) {
    JsonMembers m;
    EXPECT_FALSE(parse_json_object("[1]", &m));
    EXPECT_FALSE(parse_json_object("\"s\"", &m));
    EXPECT_FALSE(parse_json_object("{\"a\": }", &m));
    EXPECT_FALSE(parse_json_object("{\"a\": 1", &m));
    EXPECT_FALSE(parse_json_object("{\"a\": 1} x", &m));
    EXPECT_FALSE(parse_json_object("{\"a\": \"\\ud83d\"}", &m));
}

TEST(RelayStdout, OneLinePerEvent) {
    Event e;
    e.id = 42;
    e.topic = "orders";
    e.key = std::string("k\"1");
    e.payload = R"({"a": 1})";
    e.headers = std::string(R"({"h": "v"})");
    e.attempt = 3;
    EXPECT_EQ(stdout_line(e),
              R"({"id":42,"topic":"orders","key":"k\"1","headers":{"h": "v"},"payload":{"a": 1},"attempt":3})");
    e.key.reset();
    e.headers.reset();
    EXPECT_EQ(stdout_line(e),
              R"({"id":42,"topic":"orders","key":null,"headers":null,"payload":{"a": 1},"attempt":3})");
}

TEST(RelayHttp, StatusesDecideTheOutcome) {
    for (long status : {200L, 201L, 202L, 204L, 299L})
        EXPECT_EQ(classify_response(status, {}, "").verdict, Verdict::Ack) << status;
    // 409: the receiver is still working on a request with this key.
    for (long status : {408L, 409L, 425L, 429L, 500L, 502L, 503L, 504L, 599L})
        EXPECT_EQ(classify_response(status, {}, "").verdict, Verdict::Retry) << status;
    for (long status : {400L, 401L, 403L, 404L, 410L, 413L, 422L, 451L, 499L})
        EXPECT_EQ(classify_response(status, {}, "").verdict, Verdict::Dead) << status;
    // Redirects are not followed: retried, the sink may be fixed.
    EXPECT_EQ(classify_response(301, {}, "").verdict, Verdict::Retry);
}

TEST(RelayHttp, RetryAfterAndErrorText) {
    const Outcome o = classify_response(429, 7000, "slow down\nplease");
    EXPECT_EQ(o.verdict, Verdict::Retry);
    ASSERT_TRUE(o.retry_in.has_value());
    EXPECT_EQ(*o.retry_in, 7000);
    EXPECT_EQ(o.error, "HTTP 429: slow down please");
    EXPECT_FALSE(classify_response(503, {}, "").retry_in.has_value());
    EXPECT_EQ(classify_response(400, 5000, "").error, "HTTP 400");
    EXPECT_EQ(classify_response(409, 2000, "").retry_in, std::optional<std::int64_t>(2000));
    EXPECT_EQ(classify_response(404, {}, "").status, 404);
}

TEST(RelayHttp, ParseRetryAfter) {
    const std::time_t now = 1700000000;  // 2023-11-14T22:13:20Z
    EXPECT_EQ(parse_retry_after("120", now), 120000);
    EXPECT_EQ(parse_retry_after(" 0\r\n", now), 0);
    EXPECT_EQ(parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now), 30000);
    EXPECT_EQ(parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now), 0);
    EXPECT_FALSE(parse_retry_after("", now).has_value());
    EXPECT_FALSE(parse_retry_after("soon", now).has_value());
    EXPECT_FALSE(parse_retry_after("-5", now).has_value());
    EXPECT_EQ(parse_retry_after("99999999999999999999", now), 100LL * 365 * 24 * 3600 * 1000);
}

TEST(RelayHttp, PrintableErrorText) {
    EXPECT_EQ(printable("a\x01\xff\tb", 100), "a?? b");
    EXPECT_EQ(printable("abcdef", 3), "abc...");
}

TEST(RelayReconnectBackoff, DoublesToFiveSeconds) {
    Backoff b;
    const Millis first = b.next();
    EXPECT_GE(first.count(), 80);
    EXPECT_LE(first.count(), 120);
    Millis last{0};
    for (int i = 0; i < 20; ++i) last = b.next();
    EXPECT_GE(last.count(), 4000);
    EXPECT_LE(last.count(), 6000);
    b.reset();
    EXPECT_LE(b.next().count(), 120);
}
