// Which message a RabbitMQ channel close refuses for its size.
#include <gtest/gtest.h>

#include "relay/sinks/amqp_size_refusal.hpp"

using namespace idem::relay;

TEST(AmqpSizeRefusal, TheSizeOfTheRefusedMessage) {
    EXPECT_EQ(refused_message_size("channel closed: 406 PRECONDITION_FAILED - message size 10002 is "
                                   "larger than configured max size 4096"),
              std::optional<std::size_t>(10002));
    EXPECT_EQ(refused_message_size("message size 0 is larger than configured max size 0"),
              std::optional<std::size_t>(0));
}

TEST(AmqpSizeRefusal, OtherClosesRefuseNoSize) {
    EXPECT_FALSE(refused_message_size("404 NOT_FOUND - no exchange 'x' in vhost '/'"));
    EXPECT_FALSE(refused_message_size("message size  is larger than configured max size 4096"));
    EXPECT_FALSE(refused_message_size("message size 12x is larger than configured max size 4096"));
    EXPECT_FALSE(refused_message_size("message size 99999999999999999999999999 is larger than configured max size 1"));
    EXPECT_FALSE(refused_message_size(""));
}
