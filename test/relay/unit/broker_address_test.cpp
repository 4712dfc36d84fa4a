// nats:// and amqp:// sink URLs, and the subjects topics become.
#include <gtest/gtest.h>

#include "relay/sinks/broker_address.hpp"

using namespace idem::relay;

TEST(NatsUrl, ServersAndPrefix) {
    NatsAddress a;
    std::string error;
    ASSERT_TRUE(parse_nats_url("nats://127.0.0.1:4222", &a, &error)) << error;
    EXPECT_EQ(a.servers, std::vector<std::string>{"nats://127.0.0.1:4222"});
    EXPECT_EQ(a.prefix, "");
    // A list is a URL per server for the client, each with the list's user.
    ASSERT_TRUE(parse_nats_url("nats://u:p@a:1,b:2,[::1]:3/outbox.", &a, &error)) << error;
    EXPECT_EQ(a.servers, (std::vector<std::string>{"nats://u:p@a:1", "nats://u:p@b:2", "nats://u:p@[::1]:3"}));
    EXPECT_EQ(a.prefix, "outbox");
    ASSERT_TRUE(parse_nats_url("nats://TOKEN@a,b", &a, &error)) << error;
    EXPECT_EQ(a.servers, (std::vector<std::string>{"nats://TOKEN@a", "nats://TOKEN@b"}));
    // Every server's port is a port.
    for (const char* bad : {"nats://a:0", "nats://a:99999", "nats://a:notaport", "nats://a,b:65536",
                            "nats://a:", "nats://:4222", "nats://[::1"}) {
        EXPECT_FALSE(parse_nats_url(bad, &a, &error)) << bad;
    }
    EXPECT_FALSE(parse_nats_url("nats://a:99999", &a, &error));
    EXPECT_NE(error.find("from 1 to 65535"), std::string::npos) << error;
    ASSERT_TRUE(parse_nats_url("NATS://host/app.events", &a, &error)) << error;
    EXPECT_EQ(a.prefix, "app.events");
    EXPECT_FALSE(parse_nats_url("nats://", &a, &error));
    EXPECT_FALSE(parse_nats_url("nats://a,,b", &a, &error));
    EXPECT_FALSE(parse_nats_url("nats://host/a b", &a, &error));
    EXPECT_FALSE(parse_nats_url("nats://host/a.*", &a, &error));
    EXPECT_FALSE(parse_nats_url("nats://host/x?y=1", &a, &error));
    EXPECT_FALSE(parse_nats_url("http://host", &a, &error));
}

TEST(NatsSubject, FromTopic) {
    std::string subject, error;
    ASSERT_TRUE(nats_subject("outbox", "order.paid", &subject, &error)) << error;
    EXPECT_EQ(subject, "outbox.order.paid");
    ASSERT_TRUE(nats_subject("", "orders", &subject, &error)) << error;
    EXPECT_EQ(subject, "orders");
    // Wildcards, spaces and '%' are written as %XX: two topics never share a subject.
    ASSERT_TRUE(nats_subject("p", "a b*>%", &subject, &error)) << error;
    EXPECT_EQ(subject, "p.a%20b%2A%3E%25");
    ASSERT_TRUE(nats_subject("p", "caf\xc3\xa9", &subject, &error)) << error;
    EXPECT_EQ(subject, "p.caf\xc3\xa9");
    EXPECT_FALSE(nats_subject("p", ".a", &subject, &error));
    EXPECT_FALSE(nats_subject("p", "a..b", &subject, &error));
    EXPECT_FALSE(nats_subject("p", "a.", &subject, &error));
    EXPECT_FALSE(nats_subject("p", "", &subject, &error));
}

TEST(AmqpUrl, Parts) {
    AmqpAddress a;
    std::string error;
    ASSERT_TRUE(parse_amqp_url("amqp://127.0.0.1", &a, &error)) << error;
    EXPECT_EQ(a.host, "127.0.0.1");
    EXPECT_EQ(a.port, 5672);
    EXPECT_EQ(a.user, "guest");
    EXPECT_EQ(a.password, "guest");
    EXPECT_EQ(a.vhost, "/");
    EXPECT_EQ(a.exchange, "");
    ASSERT_TRUE(parse_amqp_url("amqp://relay:p%40ss@mq:5673/prod?exchange=events", &a, &error))
        << error;
    EXPECT_EQ(a.host, "mq");
    EXPECT_EQ(a.port, 5673);
    EXPECT_EQ(a.user, "relay");
    EXPECT_EQ(a.password, "p@ss");
    EXPECT_EQ(a.vhost, "prod");
    EXPECT_EQ(a.exchange, "events");
    ASSERT_TRUE(parse_amqp_url("amqp://[::1]:5672/%2F", &a, &error)) << error;
    EXPECT_EQ(a.host, "::1");
    EXPECT_EQ(a.vhost, "/");
    EXPECT_FALSE(parse_amqp_url("amqp://u:p@/v", &a, &error));
    EXPECT_FALSE(parse_amqp_url("amqp://h:0", &a, &error));
    EXPECT_FALSE(parse_amqp_url("amqp://h:99999", &a, &error));
    EXPECT_FALSE(parse_amqp_url("amqp://h/v?queue=q", &a, &error));
    EXPECT_FALSE(parse_amqp_url("amqp://h/%zz", &a, &error));
}

TEST(IdempotencyKey, DedupKeyOrOutboxId) {
    Event e;
    e.id = 42;
    EXPECT_EQ(idempotency_key(e), "outbox-42");
    e.dedup_key = "order-7";
    EXPECT_EQ(idempotency_key(e), "order-7");
}

// One stream may take several topics, and a dedup_key is unique within its
// topic only: the message id names the subject too, so that two events
// never share one.
TEST(IdempotencyKey, NatsMessageIdNamesTheSubject) {
    Event paid, refunded;
    paid.id = 1;
    paid.dedup_key = "order-7";
    refunded.id = 2;
    refunded.dedup_key = "order-7";
    EXPECT_EQ(nats_message_id("outbox.order.paid", paid), "outbox.order.paid order-7");
    EXPECT_NE(nats_message_id("outbox.order.paid", paid), nats_message_id("outbox.order.refunded", refunded));
    // Two databases' events of one id, each under its own prefix.
    Event first, other;
    first.id = other.id = 5;
    EXPECT_NE(nats_message_id("billing.t", first), nats_message_id("crm.t", other));
    // The key is written as a header value: its space cannot pose as the
    // separator (topic "a", key "b c" against topic "a b", key "c").
    Event spaced;
    spaced.id = 3;
    spaced.dedup_key = "b c";
    EXPECT_EQ(nats_message_id("p.a", spaced), "p.a b%20c");
}

// amqps:// is RabbitMQ over TLS, on 5671 unless a port is given.
TEST(RelayBrokerAddress, AmqpsIsTls) {
    AmqpAddress a;
    std::string error;
    ASSERT_TRUE(parse_amqp_url("amqps://u:p@mq/prod", &a, &error)) << error;
    EXPECT_TRUE(a.tls);
    EXPECT_EQ(a.port, 5671);
    EXPECT_EQ(a.vhost, "prod");
    ASSERT_TRUE(parse_amqp_url("amqps://mq:6000", &a, &error)) << error;
    EXPECT_EQ(a.port, 6000);
    ASSERT_TRUE(parse_amqp_url("amqp://mq", &a, &error)) << error;
    EXPECT_FALSE(a.tls);
    EXPECT_EQ(a.port, 5672);
}
