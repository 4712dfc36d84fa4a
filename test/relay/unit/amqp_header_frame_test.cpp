// Whether a message's properties fit in one AMQP content-header frame.
#include <gtest/gtest.h>

#include "relay/sinks/amqp_header_frame.hpp"

using namespace idem::relay;

namespace {

// Content type "application/json", a message id of 10 bytes, the topic as
// text and the id and attempt as numbers.
AmqpPropertySizes a_message() {
    AmqpPropertySizes sizes;
    sizes.content_type = 16;
    sizes.message_id = 10;
    sizes.text_headers = {{14, 6}};   // X-Outbox-Topic: orders
    sizes.number_headers = {11, 16};  // X-Outbox-Id, X-Outbox-Attempt
    return sizes;
}

}  // namespace

TEST(AmqpHeaderFrame, TheFrameCountsEachPropertyAndHeader) {
    // Frame 8; class, weight, body size, flags 14; content type 1 + 16;
    // table 4 + (1 + 14 + 1 + 4 + 6) + (1 + 11 + 1 + 8) + (1 + 16 + 1 + 8);
    // delivery mode 1; timestamp 8; message id 1 + 10.
    EXPECT_EQ(content_header_frame_bytes(a_message()), 8u + 14 + 17 + 77 + 1 + 8 + 11);
    AmqpPropertySizes without_id = a_message();
    without_id.message_id.reset();
    EXPECT_EQ(content_header_frame_bytes(without_id), content_header_frame_bytes(a_message()) - 11);
}

TEST(AmqpHeaderFrame, AMessageThatFitsExactlyIsSent) {
    const std::size_t bytes = content_header_frame_bytes(a_message());
    EXPECT_FALSE(header_frame_refusal(a_message(), bytes));
    EXPECT_FALSE(header_frame_refusal(a_message(), 0));  // no limit
}

TEST(AmqpHeaderFrame, ABytePastTheFrameIsRefusedSayingTheSizes) {
    AmqpPropertySizes big = a_message();
    big.text_headers.emplace_back(4, 131072);  // a 128 kB header value
    const std::size_t bytes = content_header_frame_bytes(big);
    const std::optional<std::string> refusal = header_frame_refusal(big, bytes - 1);
    ASSERT_TRUE(refusal);
    EXPECT_NE(refusal->find(std::to_string(bytes) + " bytes"), std::string::npos) << *refusal;
    EXPECT_NE(refusal->find(std::to_string(bytes - 1) + "-byte AMQP frame"), std::string::npos) << *refusal;
    EXPECT_TRUE(header_frame_refusal(big, 131072));
}
