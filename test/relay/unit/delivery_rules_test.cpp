// idem-relay's delivery rules that need no database or network: the wait
// after a failure, the misconfigured-sink check, claim sizes, the headers it
// sends, and what it writes to its log.
#include <gtest/gtest.h>

#include "relay/db/retry_delay.hpp"
#include "relay/loop/claim_budget.hpp"
#include "relay/loop/claim_sizer.hpp"
#include "relay/loop/sink_check.hpp"
#include "relay/observe/log.hpp"
#include "relay/redact.hpp"
#include "relay/sinks/http_headers.hpp"

using namespace idem::relay;

TEST(RelayRetryDelay, RetryAfterIsRaisedToTheBackoffAndCapped) {
    const RetrySettings s{Millis(1000), Millis(60000)};
    EXPECT_FALSE(retry_in_ms(std::nullopt, 1, s).has_value());  // the extension's backoff
    EXPECT_EQ(retry_in_ms(0, 1, s), 1000);                       // Retry-After: 0
    EXPECT_EQ(retry_in_ms(0, 3, s), 4000);                       // base * 2^(attempt-1)
    EXPECT_EQ(retry_in_ms(5000, 1, s), 5000);                    // longer than the backoff
    EXPECT_EQ(retry_in_ms(5000, 4, s), 8000);
    EXPECT_EQ(retry_in_ms(100LL * 365 * 86400 * 1000, 1, s), 60000);  // far future
    EXPECT_EQ(retry_in_ms(0, 40, s), 60000);                     // no overflow
    EXPECT_EQ(retry_in_ms(0, 1, RetrySettings{Millis(0), Millis(1000)}), 0);
}

namespace {

Outcome dead(long status) { return Outcome::dead("HTTP " + std::to_string(status), status); }

}  // namespace

TEST(RelaySinkCheck, TenAlikeFinalFailuresMeanAMisconfiguredSink) {
    SinkCheck check(10);
    for (int id = 1; id < 10; ++id)
        EXPECT_EQ(check.observe(id, dead(404)), SinkCheck::State::Undecided) << id;
    // A repeated delivery of one event is no new evidence.
    EXPECT_EQ(check.observe(9, dead(404)), SinkCheck::State::Undecided);
    EXPECT_EQ(check.observe(10, dead(404)), SinkCheck::State::Misconfigured);
    EXPECT_EQ(check.reason(), "HTTP 404");
    EXPECT_EQ(check.failed_events(), 10);
    // Decided for good.
    EXPECT_EQ(check.observe(11, Outcome::ack(200)), SinkCheck::State::Misconfigured);
}

TEST(RelaySinkCheck, AnEventRefusedAgainIsNoticed) {
    SinkCheck check(10);
    EXPECT_EQ(check.observe(1, dead(404)), SinkCheck::State::Undecided);
    EXPECT_EQ(check.observe(2, dead(404)), SinkCheck::State::Undecided);
    EXPECT_FALSE(check.refused_again());
    // Released, claimed again, refused the same way: no other event came.
    EXPECT_EQ(check.observe(1, dead(404)), SinkCheck::State::Undecided);
    EXPECT_TRUE(check.refused_again());
    EXPECT_EQ(check.conclude(), SinkCheck::State::Misconfigured);
    EXPECT_EQ(check.failed_events(), 2);
}

TEST(RelaySinkCheck, AnyOtherOutcomeShowsTheSinkWorks) {
    for (const Outcome& other : {Outcome::ack(200), Outcome::retry("HTTP 503", {}, 503),
                                 Outcome::retry("timed out"), dead(400)}) {
        SinkCheck check(10);
        EXPECT_EQ(check.observe(1, dead(404)), SinkCheck::State::Undecided);
        EXPECT_EQ(check.observe(2, other), SinkCheck::State::Working) << other.error;
        for (int id = 3; id < 20; ++id) EXPECT_EQ(check.observe(id, dead(404)), SinkCheck::State::Working);
    }
}

TEST(RelaySinkCheck, WithNothingElseToTryTheFailuresDecide) {
    SinkCheck none(10);
    EXPECT_EQ(none.conclude(), SinkCheck::State::Undecided);  // no evidence at all
    SinkCheck two(10);
    two.observe(1, dead(401));
    two.observe(2, dead(401));
    EXPECT_EQ(two.conclude(), SinkCheck::State::Misconfigured);
    EXPECT_EQ(two.failed_events(), 2);
}

namespace {

Options sizing(int batch, int parallel, Millis lease, std::int64_t bytes) {
    Options o;
    o.batch = batch;
    o.parallel = parallel;
    o.lease = lease;
    o.max_in_flight_bytes = bytes;
    return o;
}

}  // namespace

TEST(RelayClaimSizer, ABatchUntilDeliveriesShowTheirPace) {
    ClaimSizer sizer(sizing(100, 2, Millis(30000), 64 << 20), Millis(10000));
    EXPECT_EQ(sizer.want(0, 0), 100);
    EXPECT_EQ(sizer.want(50, 0), 50);
    EXPECT_EQ(sizer.want(51, 0), 0);  // more than half in flight
    for (int i = 0; i < 50; ++i) sizer.delivered(0.005);
    EXPECT_EQ(sizer.limit(), 100);    // fast: the whole batch fits in the lease
}

TEST(RelayClaimSizer, ASlowSinkGetsWhatItCanStartWithinTheLease) {
    // 1 s per delivery, lease 6 s, timeout 2 s: 4 can start in time on one thread.
    ClaimSizer sizer(sizing(100, 1, Millis(6000), 64 << 20), Millis(2000));
    sizer.delivered(1.0);
    EXPECT_EQ(sizer.limit(), 4);
    EXPECT_EQ(sizer.want(0, 0), 4);
    EXPECT_EQ(sizer.want(3, 0), 0);
    ClaimSizer wide(sizing(100, 8, Millis(6000), 64 << 20), Millis(2000));
    wide.delivered(1.0);
    EXPECT_EQ(wide.limit(), 32);
}

TEST(RelayClaimSizer, BytesInFlightAreBounded) {
    ClaimSizer sizer(sizing(100, 1, Millis(30000), 64 << 20), Millis(10000));
    sizer.claimed(20 << 20);                 // 20 MB events
    EXPECT_EQ(sizer.want(0, 0), 3);
    EXPECT_EQ(sizer.want(1, 20 << 20), 2);
    EXPECT_EQ(sizer.want(2, 40 << 20), 0);   // over half the bound in flight
    ClaimSizer huge(sizing(100, 1, Millis(30000), 1 << 20), Millis(10000));
    huge.claimed(8 << 20);
    EXPECT_EQ(huge.want(0, 0), 1);           // one event larger than the bound still goes
}

TEST(RelayClaimBudget, EventsFitWhileTheirRunningTotalStaysWithinTheBudget) {
    const ClaimBudget budget{100, false};
    EXPECT_EQ(budget.fitting({}), 0u);
    EXPECT_EQ(budget.fitting({40, 60}), 2u);       // exactly the budget
    EXPECT_EQ(budget.fitting({40, 61}), 1u);
    EXPECT_EQ(budget.fitting({40, 70, 10}), 1u);   // a prefix: a small one after does not slip in
    EXPECT_EQ(budget.fitting({0, 0, 100, 0}), 4u);
    EXPECT_EQ(budget.fitting({101, 1}), 0u);
}

TEST(RelayClaimBudget, TheFirstGoesAnywayWhenNothingIsInFlight) {
    const ClaimBudget budget{100, true};
    EXPECT_EQ(budget.fitting({500}), 1u);          // larger than the budget: alone
    EXPECT_EQ(budget.fitting({500, 1}), 1u);
    EXPECT_EQ(budget.fitting({30, 70, 1}), 2u);    // otherwise as without
    EXPECT_EQ((ClaimBudget{0, true}).fitting({1, 0}), 1u);   // the first counts in the total
    EXPECT_EQ((ClaimBudget{0, false}).fitting({0, 1}), 1u);
}

TEST(RelayHeaders, ValuesAreEncodedReversibly) {
    EXPECT_EQ(encode_header_value("order-42"), "order-42");
    EXPECT_EQ(encode_header_value("same\nkey"), "same%0Akey");
    EXPECT_EQ(encode_header_value("same%0Akey"), "same%250Akey");
    EXPECT_EQ(encode_header_value("a b\r\x01\x7f"), "a%20b%0D%01%7F");
    EXPECT_EQ(encode_header_value("caf\xc3\xa9"), "caf%C3%A9");
    EXPECT_EQ(encode_header_value(" x "), "%20x%20");
}

TEST(RelayHeaders, ReservedNamesFoldUnderscoresAndCase) {
    for (const char* name : {"Idempotency-Key", "idempotency_key", "X_Outbox_Id", "x-outbox-TOPIC",
                             "X_OUTBOX_KEY", "x_outbox_attempt", "Content_Length",
                             "Transfer-Encoding", "host", "Connection", "Expect"})
        EXPECT_TRUE(is_reserved_header(name)) << name;
    for (const char* name : {"X-Custom", "Content-Type", "Idempotency-Keys", "X-Outbox"})
        EXPECT_FALSE(is_reserved_header(name)) << name;
}

TEST(RelayHeaders, NamesAndValues) {
    EXPECT_TRUE(is_header_name("X-Custom_1"));
    EXPECT_FALSE(is_header_name(""));
    EXPECT_FALSE(is_header_name("X Custom"));
    EXPECT_FALSE(is_header_name("X:Custom"));
    EXPECT_TRUE(is_header_value("a\tb caf\xc3\xa9"));
    for (const char* bad : {"a\rb", "a\nb", "a\x01" "b", "a\x7f"}) EXPECT_FALSE(is_header_value(bad)) << bad;
    EXPECT_FALSE(is_header_value(std::string("a\0b", 3)));
}

TEST(RelayLog, NoTextStartsALineOfItsOwn) {
    EXPECT_EQ(log_safe("key\n2000-01-01 forged\r"), "key\\n2000-01-01 forged\\r");
    EXPECT_EQ(log_safe("a\tb\x01\x7f"), "a\tb\\x01\\x7F");
    EXPECT_EQ(log_safe("caf\xc3\xa9"), "caf\xc3\xa9");
}

TEST(RelayRedact, PasswordsAndQueryValues) {
    EXPECT_EQ(redact_url("https://user:pw@host:8443/hook?token=abc&v=2#top"),
              "https://***:***@host:8443/hook?token=***&v=***#top");
    EXPECT_EQ(redact_url("http://host/hook"), "http://host/hook");
    EXPECT_EQ(redact_url("http://a:b@"), "http://***:***@");
    EXPECT_EQ(redact_url("http://h/p?x=1&&y="), "http://h/p?x=***&&y=***");
    EXPECT_EQ(redact_url("http://h/p?token=s3cret"), "http://h/p?token=***");
}

// A bare user name is often the secret itself (a token as the URL's user).
TEST(RelayRedact, EveryUserinfoPart) {
    EXPECT_EQ(redact_url("http://TOKEN@host/?flag"), "http://***@host/?flag");
    EXPECT_EQ(redact_url("nats://TOKEN@h1:4222"), "nats://***@h1:4222");
    EXPECT_EQ(redact_url("amqp://user:p%40ss@rabbit/%2F?exchange=x"),
              "amqp://***:***@rabbit/%2F?exchange=***");
    EXPECT_EQ(redact_url("https://u:p:q@h/"), "https://***:***@h/");
    EXPECT_EQ(redact_url("http://a@b@h/"), "http://***@h/");
    // Lists of servers: each one's userinfo, in both spellings.
    EXPECT_EQ(redact_url("nats://a:b@h1,c:d@h2/outbox"), "nats://***:***@h1,***:***@h2/outbox");
    EXPECT_EQ(redact_url("nats://a:b@h1,nats://TOK@h2"), "nats://***:***@h1,nats://***@h2");
    EXPECT_EQ(redact_url("nats://h1,h2"), "nats://h1,h2");
    EXPECT_EQ(redact_url("not a url user:pw@x"), "not a url user:pw@x");
}
