#include "relay/sinks/amqp_sink.hpp"

#include "relay/redact.hpp"
#include "relay/sinks/amqp_size_refusal.hpp"
#include "relay/sinks/broker_address.hpp"

#ifdef IDEM_RELAY_AMQP

#include <atomic>
#include <chrono>
#include <cstring>
#include <strings.h>
#include <sys/time.h>
#include <optional>
#include <poll.h>
#include <unordered_map>
#include <vector>

// rabbitmq-c 0.12 moved its headers (the old names warn).
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

#include "relay/observe/log.hpp"
#include "relay/sinks/amqp_header_frame.hpp"
#include "relay/sinks/broker_headers.hpp"
#include "relay/sinks/sink_fault.hpp"
#include "relay/sinks/socket_deadline.hpp"

namespace idem::relay {

namespace {

constexpr amqp_channel_t kChannel = 1;
constexpr int kDeliveryModePersistent = 2;
constexpr const char* kOutboxIdHeader = "X-Outbox-Id";
// The longest wait for the broker's next frame: a stop is noticed within it.
constexpr std::chrono::milliseconds kShortWait{50};

// CC and BCC route a message to more queues (sender-selected
// distribution): an event's own headers may not set them.
bool amqp_reserved(std::string_view name) {
    return (name.size() == 2 && strncasecmp(name.data(), "cc", 2) == 0) ||
           (name.size() == 3 && strncasecmp(name.data(), "bcc", 3) == 0);
}

amqp_bytes_t bytes_of(const std::string& text) {
    amqp_bytes_t bytes;
    bytes.len = text.size();
    bytes.bytes = const_cast<char*>(text.data());
    return bytes;
}

std::string text_of(amqp_bytes_t bytes) {
    return std::string(static_cast<const char*>(bytes.bytes), bytes.len);
}

timeval timeval_of(Clock::duration d) {
    const long long us =
        std::max<long long>(0, std::chrono::duration_cast<std::chrono::microseconds>(d).count());
    timeval tv;
    tv.tv_sec = static_cast<time_t>(us / 1000000);
    tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
    return tv;
}

std::string reply_text(const amqp_rpc_reply_t& reply) {
    switch (reply.reply_type) {
        case AMQP_RESPONSE_NORMAL: return "ok";
        case AMQP_RESPONSE_NONE: return "no answer";
        case AMQP_RESPONSE_LIBRARY_EXCEPTION: return amqp_error_string2(reply.library_error);
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
                const auto* close = static_cast<amqp_connection_close_t*>(reply.reply.decoded);
                return "connection closed: " + std::to_string(close->reply_code) + " " +
                       text_of(close->reply_text);
            }
            if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
                const auto* close = static_cast<amqp_channel_close_t*>(reply.reply.decoded);
                return "channel closed: " + std::to_string(close->reply_code) + " " +
                       text_of(close->reply_text);
            }
            return "server error";
    }
    return "unknown";
}

// The X-Outbox-Id of a message the broker returned.
bool outbox_id(const amqp_basic_properties_t& properties, std::int64_t* id) {
    if ((properties._flags & AMQP_BASIC_HEADERS_FLAG) == 0) return false;
    for (int i = 0; i < properties.headers.num_entries; ++i) {
        const amqp_table_entry_t& entry = properties.headers.entries[i];
        if (text_of(entry.key) == kOutboxIdHeader && entry.value.kind == AMQP_FIELD_KIND_I64) {
            *id = entry.value.value.i64;
            return true;
        }
    }
    return false;
}

class AmqpSink : public GroupSink {
public:
    AmqpSink(const AmqpAddress& address, const Options& options, const std::atomic<bool>& aborted,
             SinkFault& fault)
        : address_(address), timeout_(options.http_timeout),
          connect_timeout_(options.connect_timeout), options_(options), aborted_(aborted),
          fault_(fault), watchdog_(aborted) {}

    // A blocked connection would not read the goodbye.
    ~AmqpSink() override { disconnect(blocked_.empty()); }

    void deliver_group(const std::vector<const Event*>& events,
                       std::vector<Outcome>* outcomes) override {
        const Clock::time_point deadline = Clock::now() + timeout_;
        outcomes->assign(events.size(), Outcome::retry("not published"));
        std::string error;
        if (fault_.is_set() || (conn_ == nullptr && !connect(&error))) {
            // A refused configuration charges no attempt: the relay stops.
            for (Outcome& outcome : *outcomes)
                outcome = fault_.is_set() ? Outcome::skip(fault_.reason()) : Outcome::retry(error);
            return;
        }
        // Delivery tags count the channel's publishes from 1.
        by_tag_.clear();
        by_id_.clear();
        returned_.clear();
        body_sizes_.clear();
        for (const Event* event : events) body_sizes_.push_back(event->payload.size());
        // A connection the broker blocked publishes nothing until unblocked.
        if (!blocked_.empty() && !await_unblocked(deadline)) {
            for (Outcome& outcome : *outcomes)
                outcome = conn_ != nullptr ? Outcome::skip(held_back()) : Outcome::retry(unconfirmed_);
            return;
        }
        // A publish blocks while the broker does not read (a memory or disk
        // alarm blocks publishing connections): the watchdog cuts it at the
        // group's deadline, well before the events' leases end.
        watchdog_.arm(amqp_get_sockfd(conn_), deadline);
        for (std::size_t i = 0; i < events.size(); ++i) {
            // The broker says it blocked the connection as soon as it reads a
            // publish during an alarm: the rest of the group waits.
            if (!read_waiting_frames(outcomes)) {
                for (std::size_t j = i; j < events.size(); ++j) (*outcomes)[j] = Outcome::retry(unconfirmed_);
                break;
            }
            if (!blocked_.empty()) {
                for (std::size_t j = i; j < events.size(); ++j) (*outcomes)[j] = Outcome::skip(held_back());
                break;
            }
            std::string refusal;
            const Published published = publish(*events[i], &refusal);
            if (published == Published::Refused) {
                (*outcomes)[i] = Outcome::dead(refusal);
                continue;
            }
            if (published == Published::Failed) {
                error = Clock::now() >= deadline
                            ? "AMQP publish: not sent within " + std::to_string(timeout_.count()) +
                                  " ms (is the connection blocked by a broker alarm?)"
                        : aborted_.load() ? std::string("the relay is stopping now")
                                          : std::string("AMQP publish: connection lost");
                for (std::size_t j = i; j < events.size(); ++j) (*outcomes)[j] = Outcome::retry(error);
                // Those published before it are never confirmed now.
                unconfirmed_ = "published, not confirmed: " + error;
                disconnect(false);
                break;
            }
            by_tag_[next_tag_++] = i;
            by_id_[events[i]->id] = i;
        }
        // Confirms are awaited with short waits of their own: the watchdog
        // bounds the writes only, so a blocked connection is kept (below).
        if (watchdog_.disarm() && conn_ != nullptr) disconnect(false);
        if (conn_ != nullptr) await(deadline, outcomes);
        // Whatever is not confirmed now is retried. While the broker blocks
        // the connection it has not refused them: they count no attempt, and
        // the connection stays open, so that the next group knows it is
        // blocked and publishes nothing until it unblocks. Otherwise the next
        // group starts on a new connection.
        const bool held = conn_ != nullptr && !blocked_.empty();
        for (const auto& [tag, slot] : by_tag_)
            (*outcomes)[slot] =
                held ? Outcome::skip(published_while_blocked()) : Outcome::retry(unconfirmed_);
        if (!by_tag_.empty() && !held) disconnect(false);
        by_tag_.clear();
    }

private:
    bool connect(std::string* error) {
        conn_ = amqp_new_connection();
        amqp_socket_t* socket = conn_ == nullptr  ? nullptr
                                : address_.tls    ? amqp_ssl_socket_new(conn_)
                                                  : amqp_tcp_socket_new(conn_);
        const std::string where = "RabbitMQ at " + address_.host + ":" + std::to_string(address_.port);
        if (socket == nullptr) {
            *error = "cannot create a socket for " + where;
            disconnect(true);
            return false;
        }
        if (address_.tls) {
            // The CA given (a private one), else the system's.
            const std::string ca =
                options_.ca_file.empty() ? "/etc/ssl/certs/ca-certificates.crt" : options_.ca_file;
            int tls_status = amqp_ssl_socket_set_cacert(socket, ca.c_str());
            if (tls_status == AMQP_STATUS_OK && !options_.client_cert.empty())
                tls_status = amqp_ssl_socket_set_key(
                    socket, options_.client_cert.c_str(),
                    (options_.client_key.empty() ? options_.client_cert : options_.client_key).c_str());
            if (tls_status != AMQP_STATUS_OK) {
                fault_.set("RabbitMQ TLS: cannot use --ca-file, --client-cert or --client-key: " +
                           std::string(amqp_error_string2(tls_status)));
                *error = fault_.reason();
                disconnect(false);
                return false;
            }
        }
        timeval connect_tv = timeval_of(connect_timeout_);
        const int status = amqp_socket_open_noblock(socket, address_.host.c_str(), address_.port,
                                                    &connect_tv);
        if (status != AMQP_STATUS_OK) {
            *error = "cannot connect to " + where + ": " + amqp_error_string2(status);
            if (status == AMQP_STATUS_SSL_PEER_VERIFY_FAILED ||
                status == AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED)
                fault_.set("RabbitMQ TLS: " + *error +
                           " (the broker's certificate is not trusted: give its CA with --ca-file)");
            disconnect(false);
            return false;
        }
        timeval rpc_tv = timeval_of(timeout_);
        amqp_set_rpc_timeout(conn_, &rpc_tv);
        amqp_set_handshake_timeout(conn_, &connect_tv);
        // The connection.blocked capability: RabbitMQ then says when (and
        // why) it stops reading the connection's publishes, and when it
        // reads them again.
        amqp_table_entry_t blocked_capability;
        blocked_capability.key = amqp_cstring_bytes("connection.blocked");
        blocked_capability.value.kind = AMQP_FIELD_KIND_BOOLEAN;
        blocked_capability.value.value.boolean = 1;
        amqp_table_entry_t capabilities;
        capabilities.key = amqp_cstring_bytes("capabilities");
        capabilities.value.kind = AMQP_FIELD_KIND_TABLE;
        capabilities.value.value.table.num_entries = 1;
        capabilities.value.value.table.entries = &blocked_capability;
        const amqp_table_t client_properties{1, &capabilities};
        blocked_.clear();
        amqp_rpc_reply_t reply = amqp_login_with_properties(
            conn_, address_.vhost.c_str(), 0, 131072, 0, &client_properties, AMQP_SASL_METHOD_PLAIN,
            address_.user.c_str(), address_.password.c_str());
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            *error = "cannot log in to " + where + " (vhost " + address_.vhost + "): " + reply_text(reply);
            // The broker answered and refused the user, the password or the
            // vhost (it closes the connection on any of them): no retry
            // would change that.
            if (login_refused(reply))
                fault_.set("RabbitMQ refused the relay's login: " + *error +
                           " (check the user, password and vhost of --sink)");
            disconnect(false);
            return false;
        }
        amqp_channel_open(conn_, kChannel);
        reply = amqp_get_rpc_reply(conn_);
        if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
            amqp_confirm_select(conn_, kChannel);
            reply = amqp_get_rpc_reply(conn_);
        }
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            *error = "cannot open a confirmed channel on " + where + ": " + reply_text(reply);
            disconnect(false);
            return false;
        }
        // The exchange must exist (a passive declare changes nothing): a
        // publish to a missing one closes the channel, for every event.
        if (!address_.exchange.empty()) {
            amqp_exchange_declare(conn_, kChannel, bytes_of(address_.exchange), amqp_empty_bytes,
                                  1 /* passive */, 0, 0, 0, amqp_empty_table);
            reply = amqp_get_rpc_reply(conn_);
            if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
                *error = "exchange '" + address_.exchange + "' on " + where + " (vhost " +
                         address_.vhost + "): " + reply_text(reply);
                if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
                    reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
                    static_cast<amqp_channel_close_t*>(reply.reply.decoded)->reply_code ==
                        AMQP_NOT_FOUND)
                    fault_.set("RabbitMQ has no " + *error +
                               " (declare it, or check ?exchange= of --sink)");
                disconnect(false);
                return false;
            }
        }
        next_tag_ = 1;
        return true;
    }

    // A login the broker answered with a refusal: a connection.close
    // (ACCESS_REFUSED, NOT_ALLOWED for a vhost) or, where the broker just
    // closes the socket after the handshake, the connection closed once
    // the broker had begun it (its connection.start, with its properties,
    // came). A peer that closes before any of it (a load balancer with no
    // broker behind it) is a broker out of reach, whose events are retried.
    bool login_refused(const amqp_rpc_reply_t& reply) const {
        if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION)
            return reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD;
        const amqp_table_t* started = amqp_get_server_properties(conn_);
        return reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
               (reply.library_error == AMQP_STATUS_CONNECTION_CLOSED ||
                reply.library_error == AMQP_STATUS_SOCKET_CLOSED) &&
               started != nullptr && started->num_entries > 0;
    }

    // polite: say goodbye to the broker first (when the connection still works).
    void disconnect(bool polite) {
        if (conn_ == nullptr) {
            watchdog_.disarm();
            return;
        }
        if (polite) {
            // Even a goodbye blocks on a connection the broker stopped reading.
            watchdog_.arm(amqp_get_sockfd(conn_), Clock::now() + connect_timeout_);
            amqp_channel_close(conn_, kChannel, AMQP_REPLY_SUCCESS);
            amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
        }
        // Before the socket is closed: the watchdog never touches a closed fd.
        watchdog_.disarm();
        amqp_destroy_connection(conn_);
        conn_ = nullptr;
    }

    enum class Published { Sent, Failed, Refused };

    // Publishes event; Refused (why in *refusal) when it can never be sent.
    Published publish(const Event& event, std::string* refusal) {
        std::string content_type;
        const HeaderList own = event_headers(event, amqp_reserved, &content_type);
        const std::string key = idempotency_key(event);
        std::vector<amqp_table_entry_t> entries;
        entries.reserve(own.size() + 5);
        auto add_text = [&entries](const std::string& name, const std::string& value) {
            amqp_table_entry_t entry;
            entry.key = bytes_of(name);
            entry.value.kind = AMQP_FIELD_KIND_UTF8;
            entry.value.value.bytes = bytes_of(value);
            entries.push_back(entry);
        };
        auto add_number = [&entries](const char* name, std::int64_t value) {
            amqp_table_entry_t entry;
            entry.key = amqp_cstring_bytes(name);
            entry.value.kind = AMQP_FIELD_KIND_I64;
            entry.value.value.i64 = value;
            entries.push_back(entry);
        };
        for (const auto& [name, value] : own)
            if (name.size() <= 255) add_text(name, value);
        // The relay's own, with the id and attempt as numbers; the topic and
        // key as they are (AMQP strings carry any bytes).
        add_number(kOutboxIdHeader, event.id);
        add_text(topic_name_, event.topic);
        if (event.key) add_text(key_name_, *event.key);
        add_number("X-Outbox-Attempt", event.attempt);

        amqp_basic_properties_t properties;
        memset(&properties, 0, sizeof properties);
        properties._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                            AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
        properties.content_type = bytes_of(content_type);
        properties.delivery_mode = kDeliveryModePersistent;
        properties.timestamp = static_cast<uint64_t>(event.enqueued_at);
        if (key.size() <= 255) {
            properties._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
            properties.message_id = bytes_of(key);
        }
        properties.headers.num_entries = static_cast<int>(entries.size());
        properties.headers.entries = entries.data();
        if (std::optional<std::string> refused = header_frame_refusal(
                property_sizes(properties), static_cast<std::size_t>(amqp_get_frame_max(conn_)))) {
            *refusal = std::move(*refused);
            return Published::Refused;
        }
        const int status =
            amqp_basic_publish(conn_, kChannel, bytes_of(address_.exchange), bytes_of(event.topic),
                               1 /* mandatory */, 0, &properties, bytes_of(event.payload));
        return status == AMQP_STATUS_OK ? Published::Sent : Published::Failed;
    }

    static AmqpPropertySizes property_sizes(const amqp_basic_properties_t& properties) {
        AmqpPropertySizes sizes;
        sizes.content_type = properties.content_type.len;
        if (properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) sizes.message_id = properties.message_id.len;
        for (int i = 0; i < properties.headers.num_entries; ++i) {
            const amqp_table_entry_t& entry = properties.headers.entries[i];
            if (entry.value.kind == AMQP_FIELD_KIND_I64)
                sizes.number_headers.push_back(entry.key.len);
            else
                sizes.text_headers.emplace_back(entry.key.len, entry.value.value.bytes.len);
        }
        return sizes;
    }

    // Reads the broker's answers until every publish is confirmed, the
    // deadline passes or the relay is told to hurry.
    void await(Clock::time_point deadline, std::vector<Outcome>* outcomes) {
        unconfirmed_ = "no confirm within " + std::to_string(timeout_.count()) + " ms";
        read_until(deadline, [this] { return by_tag_.empty(); }, outcomes);
    }

    // Reads and handles the broker's frames until done(), the deadline passes
    // or the relay is told to hurry. False when the connection is gone (then
    // conn_ is null and unconfirmed_ says why).
    template <typename Done>
    bool read_until(Clock::time_point deadline, Done done, std::vector<Outcome>* outcomes) {
        while (!done()) {
            if (aborted_.load()) {
                unconfirmed_ = "the relay is stopping now";
                return true;
            }
            const Clock::time_point now = Clock::now();
            if (now >= deadline) return true;
            // Short waits, so that a stop is noticed.
            if (read_frame(std::min<Clock::duration>(deadline - now, kShortWait), outcomes) == Read::Gone)
                return false;
        }
        return true;
    }

    // Reads the frames the broker has sent already, without waiting. False
    // when the connection is gone (unconfirmed_ says why).
    bool read_waiting_frames(std::vector<Outcome>* outcomes) {
        while (amqp_frames_enqueued(conn_) || amqp_data_in_buffer(conn_) ||
               readable(amqp_get_sockfd(conn_))) {
            const Read read = read_frame(Clock::duration::zero(), outcomes);
            if (read != Read::Handled) return read == Read::Nothing;
        }
        return true;
    }

    static bool readable(int fd) {
        pollfd ready{fd, POLLIN, 0};
        return poll(&ready, 1, 0) > 0;
    }

    // Waits until the broker unblocks the connection, the deadline passes or
    // the relay is told to hurry. False when still blocked, or the
    // connection is gone (then conn_ is null and unconfirmed_ says why).
    bool await_unblocked(Clock::time_point deadline) {
        std::vector<Outcome> none;  // no publishes of this group yet
        return read_until(deadline, [this] { return blocked_.empty(); }, &none) && blocked_.empty();
    }

    enum class Read { Handled, Nothing, Gone };

    // Reads and handles one frame, waiting at most `wait` for it. Gone: the
    // connection was lost or closed (disconnected; unconfirmed_ says why).
    Read read_frame(Clock::duration wait, std::vector<Outcome>* outcomes) {
        timeval tv = timeval_of(wait);
        amqp_maybe_release_buffers(conn_);
        amqp_frame_t frame;
        const int status = amqp_simple_wait_frame_noblock(conn_, &frame, &tv);
        if (status == AMQP_STATUS_TIMEOUT) return Read::Nothing;
        if (status != AMQP_STATUS_OK) {
            unconfirmed_ = aborted_.load()
                               ? std::string("the relay is stopping now")
                               : std::string("AMQP connection lost: ") + amqp_error_string2(status);
            disconnect(false);
            return Read::Gone;
        }
        return handle(frame, outcomes) ? Read::Handled : Read::Gone;
    }

    std::string held_back() const {
        return "RabbitMQ has blocked the connection (" + blocked_ + "): not published, no attempt counted";
    }

    std::string published_while_blocked() const {
        return "published, not confirmed: RabbitMQ has blocked the connection (" + blocked_ +
               "); no attempt counted (RabbitMQ may store it when the alarm clears)";
    }

    // One frame from the broker. False when it closed the channel or the
    // connection (unconfirmed_ says why; disconnected).
    bool handle(const amqp_frame_t& frame, std::vector<Outcome>* outcomes) {
        if (frame.frame_type != AMQP_FRAME_METHOD) return true;
        switch (frame.payload.method.id) {
            case AMQP_BASIC_ACK_METHOD: {
                const auto* ack = static_cast<amqp_basic_ack_t*>(frame.payload.method.decoded);
                settle(ack->delivery_tag, ack->multiple != 0, true, outcomes);
                return true;
            }
            case AMQP_BASIC_NACK_METHOD: {
                const auto* nack = static_cast<amqp_basic_nack_t*>(frame.payload.method.decoded);
                settle(nack->delivery_tag, nack->multiple != 0, false, outcomes);
                return true;
            }
            case AMQP_BASIC_RETURN_METHOD: return read_return(frame, outcomes);
            case AMQP_CONNECTION_BLOCKED_METHOD: {
                const auto* blocked = static_cast<amqp_connection_blocked_t*>(frame.payload.method.decoded);
                blocked_ = blocked->reason.len > 0 ? text_of(blocked->reason) : "no reason given";
                blocked_since_ = Clock::now();
                log_warning("RabbitMQ blocked the connection (%s): publishing paused, the claimed events "
                            "released with no attempt counted until it unblocks", log_safe(blocked_).c_str());
                return true;
            }
            case AMQP_CONNECTION_UNBLOCKED_METHOD:
                if (!blocked_.empty())
                    log_info("RabbitMQ unblocked the connection after %.1f s: publishing again",
                             std::chrono::duration<double>(Clock::now() - blocked_since_).count());
                blocked_.clear();
                return true;
            case AMQP_CHANNEL_CLOSE_METHOD:
            case AMQP_CONNECTION_CLOSE_METHOD: {
                amqp_rpc_reply_t reply;
                reply.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
                reply.reply = frame.payload.method;
                unconfirmed_ = "RabbitMQ " + reply_text(reply);
                refuse_oversized(unconfirmed_, outcomes);
                // A channel closed on an error (a missing exchange) is not
                // reopened here: the next group starts on a new connection.
                disconnect(false);
                return false;
            }
            default: return true;
        }
    }

    // A channel closed on a message over max_message_size: the unconfirmed
    // message of that size is dead (amqp_size_refusal.hpp), not retried with
    // the others of its group.
    void refuse_oversized(const std::string& close_text, std::vector<Outcome>* outcomes) {
        const std::optional<std::size_t> size = refused_message_size(close_text);
        if (!size) return;
        for (auto tag = by_tag_.begin(); tag != by_tag_.end();) {
            if (body_sizes_[tag->second] != *size) {
                ++tag;
                continue;
            }
            (*outcomes)[tag->second] = Outcome::dead("larger than RabbitMQ's max_message_size: " + close_text);
            tag = by_tag_.erase(tag);
        }
    }

    // A mandatory message no queue took comes back (basic.return) before
    // its confirm: remember it, its confirm then does not count as delivered.
    bool read_return(const amqp_frame_t& frame, std::vector<Outcome>*) {
        const auto* back = static_cast<amqp_basic_return_t*>(frame.payload.method.decoded);
        std::string why = "unroutable: RabbitMQ returned it (" + std::to_string(back->reply_code) +
                          " " + text_of(back->reply_text) + "): no queue is bound to exchange '" +
                          text_of(back->exchange) + "' for routing key '" +
                          text_of(back->routing_key) + "'";
        amqp_message_t message;
        const amqp_rpc_reply_t reply = amqp_read_message(conn_, frame.channel, &message, 0);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            unconfirmed_ = "AMQP connection lost: " + reply_text(reply);
            disconnect(false);
            return false;
        }
        std::int64_t id = 0;
        if (outbox_id(message.properties, &id)) {
            const auto found = by_id_.find(id);
            if (found != by_id_.end()) returned_[found->second] = std::move(why);
        }
        amqp_destroy_message(&message);
        return true;
    }

    void settle(std::uint64_t tag, bool multiple, bool acked, std::vector<Outcome>* outcomes) {
        for (auto it = by_tag_.begin(); it != by_tag_.end();) {
            if (it->first == tag || (multiple && it->first < tag)) {
                const std::size_t slot = it->second;
                const auto back = returned_.find(slot);
                if (back != returned_.end()) (*outcomes)[slot] = Outcome::retry(back->second);
                else if (acked) (*outcomes)[slot] = Outcome::ack();
                else (*outcomes)[slot] = Outcome::retry("RabbitMQ nacked the message");
                it = by_tag_.erase(it);
            } else {
                ++it;
            }
        }
    }

    AmqpAddress address_;
    Millis timeout_;
    Millis connect_timeout_;
    const Options& options_;
    const std::atomic<bool>& aborted_;
    SinkFault& fault_;
    SocketDeadline watchdog_;
    amqp_connection_state_t conn_ = nullptr;
    std::uint64_t next_tag_ = 1;
    std::unordered_map<std::uint64_t, std::size_t> by_tag_;     // published, not yet confirmed
    std::unordered_map<std::int64_t, std::size_t> by_id_;       // event id: slot in the group
    std::unordered_map<std::size_t, std::string> returned_;     // slot: why it came back
    std::vector<std::size_t> body_sizes_;                         // slot: the message body's bytes
    std::string unconfirmed_;
    std::string blocked_;  // while RabbitMQ blocks the connection: its reason
    Clock::time_point blocked_since_{};
    const std::string topic_name_ = "X-Outbox-Topic";
    const std::string key_name_ = "X-Outbox-Key";
};

class AmqpTarget : public SinkTarget {
public:
    AmqpTarget(AmqpAddress address, const Options& options, std::string shown)
        : address_(std::move(address)), options_(options), timeout_(options.http_timeout),
          shown_(std::move(shown)) {}

    std::unique_ptr<Sink> open() override {
        return std::make_unique<AmqpSink>(address_, options_, aborted_, fault_);
    }
    std::string fatal_error() const override { return fault_.reason(); }
    Millis max_delivery_time() const override { return timeout_; }
    std::size_t group_size() const override { return 10000; }
    void abort() override { aborted_ = true; }
    std::string describe() const override {
        return "RabbitMQ at " + shown_ + " (exchange '" + address_.exchange +
               "', routing key <topic>)";
    }

private:
    AmqpAddress address_;
    Options options_;
    Millis timeout_;
    std::string shown_;
    std::atomic<bool> aborted_{false};
    SinkFault fault_;
};

}  // namespace

std::unique_ptr<SinkTarget> make_amqp_target(const Options& options, std::string* error) {
    AmqpAddress address;
    if (!parse_amqp_url(options.sink, &address, error)) {
        *error = "--sink '" + redact_url(options.sink) + "': " + *error;
        return nullptr;
    }
    return std::make_unique<AmqpTarget>(std::move(address), options, redact_url(options.sink));
}

}  // namespace idem::relay

#else

namespace idem::relay {

std::unique_ptr<SinkTarget> make_amqp_target(const Options& options, std::string* error) {
    return sink_not_built(options, "RabbitMQ", "librabbitmq-dev", error);
}

}  // namespace idem::relay

#endif
