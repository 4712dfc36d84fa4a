#include "relay/sinks/nats_sink.hpp"

#include "relay/redact.hpp"
#include "relay/sinks/broker_address.hpp"

#ifdef IDEM_RELAY_NATS

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <strings.h>
#include <unordered_map>
#include <vector>

#include <nats/nats.h>

#include "relay/json.hpp"
#include "relay/observe/log.hpp"
#include "relay/sinks/broker_headers.hpp"
#include "relay/sinks/http_headers.hpp"
#include "relay/sinks/sink_fault.hpp"

namespace idem::relay {

namespace {

// Names JetStream reads itself (Nats-Msg-Id, Nats-Expected-*, ...): an
// event's own headers may not set them.
bool nats_reserved(std::string_view name) {
    return name.size() >= 5 && strncasecmp(name.data(), "nats-", 5) == 0;
}

std::string status_text(natsStatus status) { return natsStatus_GetText(status); }

// What the relay knows of the stream a subject goes to (checked once per
// subject and delivery thread, before its first publish).
// NoJetStream: the account has no JetStream at all (a server without -js,
// an account without it).
enum class Stream { Unknown, Found, Missing, NoJetStream };

// JetStream's error codes for a message that the stream refuses whatever
// the time: larger than its max_msg_size, headers over its limit. Dead at
// once, as RabbitMQ's max_message_size (retried, each would keep its key
// waiting through every attempt's backoff).
constexpr int kMessageTooLarge = 10054;
constexpr int kHeadersTooLarge = 10097;
// "jetstream not enabled for account": the account's answer.
constexpr int kJetStreamNotEnabled = 10039;

// The first string of a JSON array's text (["A","B"] -> A); "" if none.
std::string first_string(const std::string& array) {
    const std::size_t open = array.find('"');
    if (open == std::string::npos) return {};
    const std::size_t close = array.find('"', open + 1);
    return close == std::string::npos ? std::string() : array.substr(open + 1, close - open - 1);
}

// True the first time a stream is named (one warning per stream and run).
bool first_look_at(const std::string& stream) {
    static std::mutex mutex;
    static std::unordered_map<std::string, bool> seen;
    std::lock_guard<std::mutex> lock(mutex);
    return seen.emplace(stream, true).second;
}

std::string last_error() {
    const char* text = nats_GetLastError(nullptr);
    return text != nullptr ? text : "";
}

// The servers of the URL, for messages (redacted there).
std::string servers_text(const NatsAddress& address) {
    std::string text;
    for (const std::string& server : address.servers) text += (text.empty() ? "" : ",") + server;
    return text;
}

class NatsSink : public GroupSink {
public:
    NatsSink(const NatsAddress& address, const Options& options, const std::atomic<bool>& aborted,
             SinkFault& fault)
        : address_(address), timeout_(options.http_timeout),
          connect_timeout_(options.connect_timeout), lease_(options.lease), options_(options),
          aborted_(aborted), fault_(fault) {}

    ~NatsSink() override { disconnect(); }

    void deliver_group(const std::vector<const Event*>& events,
                       std::vector<Outcome>* outcomes) override {
        const Clock::time_point deadline = Clock::now() + timeout_;
        outcomes->assign(events.size(), Outcome::retry("not published"));
        std::string error;
        if (fault_.is_set() || (js_ == nullptr && !connect(&error))) {
            // A refused configuration charges no attempt: the relay stops.
            for (Outcome& outcome : *outcomes)
                outcome = fault_.is_set() ? Outcome::skip(fault_.reason()) : Outcome::retry(error);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            outcomes_ = outcomes;
            waiting_.clear();
        }
        for (std::size_t i = 0; i < events.size(); ++i) publish(*events[i], i, deadline);
        await(deadline);
        std::lock_guard<std::mutex> lock(mutex_);
        outcomes_ = nullptr;
        waiting_.clear();
        // No stream answered for these: look again before their next publish.
        for (const std::string& subject : recheck_) streams_.erase(subject);
        recheck_.clear();
    }

private:
    bool connect(std::string* error) {
        natsOptions* options = nullptr;
        natsStatus status = natsOptions_Create(&options);
        std::vector<const char*> servers;
        for (const std::string& server : address_.servers) servers.push_back(server.c_str());
        if (status == NATS_OK)
            status = natsOptions_SetServers(options, servers.data(), static_cast<int>(servers.size()));
        if (status == NATS_OK) status = natsOptions_SetName(options, "idem-relay");
        if (status == NATS_OK)
            status = natsOptions_SetTimeout(options, static_cast<int64_t>(connect_timeout_.count()));
        // The client reconnects on its own, for ever; publishes made meanwhile
        // are buffered and their PubAcks awaited as usual.
        if (status == NATS_OK) status = natsOptions_SetMaxReconnect(options, -1);
        if (status == NATS_OK) status = natsOptions_SetReconnectWait(options, 250);
        // TLS with the CA given (a private one), and a client certificate.
        bool files_ok = true;
        if (status == NATS_OK && !options_.ca_file.empty()) {
            status = natsOptions_SetSecure(options, true);
            if (status == NATS_OK)
                status = natsOptions_LoadCATrustedCertificates(options, options_.ca_file.c_str());
            files_ok = status == NATS_OK;
        }
        if (status == NATS_OK && !options_.client_cert.empty()) {
            status = natsOptions_LoadCertificatesChain(
                options, options_.client_cert.c_str(),
                (options_.client_key.empty() ? options_.client_cert : options_.client_key).c_str());
            files_ok = status == NATS_OK;
        }
        if (!files_ok) {
            fault_.set(std::string("NATS TLS: cannot use --ca-file, --client-cert or --client-key: ") +
                       status_text(status) + " " + last_error());
            natsOptions_Destroy(options);
            return false;
        }
        if (status == NATS_OK) status = natsConnection_Connect(&conn_, options);
        natsOptions_Destroy(options);
        if (status != NATS_OK) {
            *error = "cannot connect to NATS at " + redact_url(servers_text(address_)) + ": " +
                     status_text(status);
            const std::string detail = last_error();
            // The server refused who we are: no retry would change that.
            const std::string more = detail.empty() ? "" : " (" + detail + ")";
            if (status == NATS_CONNECTION_AUTH_FAILED || status == NATS_NOT_PERMITTED)
                fault_.set("NATS refused the relay's credentials: " + *error + more +
                           " (check the user, password or token of --sink)");
            else if (status == NATS_SSL_ERROR || status == NATS_SECURE_CONNECTION_REQUIRED ||
                     status == NATS_SECURE_CONNECTION_WANTED)
                fault_.set("NATS TLS: " + *error + more +
                           " (a certificate not trusted: give its CA with --ca-file; a server "
                           "with or without TLS: --ca-file turns it on)");
            disconnect();
            return false;
        }
        jsOptions js_options;
        jsOptions_Init(&js_options);
        js_options.PublishAsync.AckHandler = on_ack;
        js_options.PublishAsync.AckHandlerClosure = this;
        js_options.PublishAsync.MaxPending = 1 << 20;  // a claim's events at most
        status = natsConnection_JetStream(&js_, conn_, &js_options);
        if (status != NATS_OK) {
            *error = "NATS JetStream: " + status_text(status);
            disconnect();
            return false;
        }
        return true;
    }

    void disconnect() {
        if (js_ != nullptr) {
            // PubAcks still awaited are of no use any more.
            // (libnats 3.4 crashes on a context that never published.)
            natsMsgList pending;
            if (published_ && js_PublishAsyncGetPendingList(&pending, js_) == NATS_OK)
                natsMsgList_Destroy(&pending);
            jsCtx_Destroy(js_);
        }
        js_ = nullptr;
        published_ = false;
        if (conn_ != nullptr) natsConnection_Destroy(conn_);
        conn_ = nullptr;
    }

    // The stream that takes subject, asked of JetStream's API (bounded by
    // the group's deadline). Missing only when the API answered that no
    // stream takes it; NoJetStream when nothing serves the API for the
    // account (no responders) or it says JetStream is not enabled; Unknown
    // when the API did not answer in time or answered another error (a
    // cluster electing its leader: the publish is tried, and retried as
    // usual).
    Stream find_stream(const std::string& subject, Clock::time_point deadline) {
        const long long left =
            std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
        if (left <= 0) return Stream::Unknown;
        std::string body = "{\"subject\":";
        append_json_string(body, subject);
        body += "}";
        natsMsg* reply = nullptr;
        const natsStatus asked =
            natsConnection_RequestString(&reply, conn_, "$JS.API.STREAM.NAMES", body.c_str(), left);
        if (asked != NATS_OK) {
            natsMsg_Destroy(reply);
            return asked == NATS_NO_RESPONDERS ? Stream::NoJetStream : Stream::Unknown;
        }
        JsonMembers members;
        const bool parsed = parse_json_object(
            std::string_view(natsMsg_GetData(reply), static_cast<std::size_t>(natsMsg_GetDataLength(reply))),
            &members);
        natsMsg_Destroy(reply);
        if (!parsed) return Stream::Unknown;
        std::string stream;
        for (const auto& [name, value] : members) {
            if (name == "error") return error_code(value) == kJetStreamNotEnabled ? Stream::NoJetStream
                                                                                 : Stream::Unknown;
            if (name == "streams") stream = first_string(value);
        }
        if (stream.empty()) return Stream::Missing;
        check_window(stream, subject);
        return Stream::Found;
    }

    // The err_code of a JetStream API error object; 0 if none.
    static int error_code(const std::string& error) {
        JsonMembers members;
        if (!parse_json_object(error, &members)) return 0;
        for (const auto& [name, value] : members)
            if (name == "err_code") return std::atoi(value.c_str());
        return 0;
    }

    // A repeat publish (after a lost ack, a retry) comes at the latest a
    // lease and a retry delay later: within a shorter duplicate window the
    // stream stores it again. Warned once per stream.
    void check_window(const std::string& stream, const std::string& subject) {
        if (!first_look_at(stream)) return;
        jsStreamInfo* info = nullptr;
        if (js_GetStreamInfo(&info, js_, stream.c_str(), nullptr, nullptr) != NATS_OK || info == nullptr)
            return;
        const long long window_ms = info->Config != nullptr ? info->Config->Duplicates / 1000000 : 0;
        jsStreamInfo_Destroy(info);
        const long long needed_ms = lease_.count() + timeout_.count() + kRetryDelayAllowanceMs;
        if (window_ms >= needed_ms) return;
        log_warning("JetStream stream '%s' (subject %s) keeps message ids for %.3f s "
                    "(duplicate_window), shorter than the lease plus the retry delay "
                    "(%.3f s): an event published again after that (a relay killed before "
                    "its ack, a retry after a lost PubAck) is stored twice; set the stream's "
                    "duplicate_window to at least %.0f s",
                    stream.c_str(), subject.c_str(), window_ms / 1000.0, needed_ms / 1000.0,
                    std::ceil(needed_ms / 1000.0));
    }

    void publish(const Event& event, std::size_t slot, Clock::time_point deadline) {
        std::string subject, error;
        if (!nats_subject(address_.prefix, event.topic, &subject, &error)) {
            set_outcome(slot, Outcome::dead(error));
            return;
        }
        Stream& known = streams_[subject];
        if (known != Stream::Found) {
            known = find_stream(subject, deadline);
            if (known == Stream::Missing || known == Stream::NoJetStream) {
                fault_.set(known == Stream::Missing
                               ? "no JetStream stream takes subject " + subject +
                                     " (create a stream for it, or check the prefix of --sink)"
                               : "NATS has no JetStream for the relay's account (subject " + subject +
                                     "): start nats-server with JetStream (-js), or enable it for "
                                     "the account of --sink's user");
                set_outcome(slot, Outcome::skip(fault_.reason()));
                return;
            }
        }
        natsMsg* message = nullptr;
        natsStatus status = natsMsg_Create(&message, subject.c_str(), nullptr,
                                           event.payload.data(),
                                           static_cast<int>(event.payload.size()));
        std::string content_type;
        if (status == NATS_OK) {
            for (const auto& [name, value] : event_headers(event, nats_reserved, &content_type))
                if (status == NATS_OK) status = natsMsgHeader_Add(message, name.c_str(), value.c_str());
            for (const auto& [name, value] : relay_headers(event))
                if (status == NATS_OK) status = natsMsgHeader_Set(message, name.c_str(), value.c_str());
            if (status == NATS_OK)
                status = natsMsgHeader_Set(message, "Content-Type", content_type.c_str());
            if (status == NATS_OK)
                status = natsMsgHeader_Set(message, "Nats-Msg-Id", nats_message_id(subject, event).c_str());
        }
        if (status != NATS_OK) {
            natsMsg_Destroy(message);
            set_outcome(slot, Outcome::retry("NATS message: " + status_text(status)));
            return;
        }
        {
            // Before the publish: its PubAck may come back before the call returns.
            std::lock_guard<std::mutex> lock(mutex_);
            waiting_[message] = slot;
        }
        natsMsg* sent = message;
        published_ = true;
        status = js_PublishMsgAsync(js_, &sent, nullptr);
        if (status == NATS_OK) return;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            waiting_.erase(message);
        }
        natsMsg_Destroy(sent);
        if (status == NATS_MAX_PAYLOAD)
            set_outcome(slot, Outcome::dead("larger than the NATS server's max_payload"));
        else
            set_outcome(slot, Outcome::retry("NATS publish: " + status_text(status) + " " +
                                             last_error()));
    }

    void set_outcome(std::size_t slot, Outcome outcome) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (outcomes_ != nullptr) (*outcomes_)[slot] = std::move(outcome);
    }

    // Runs on the client's thread.
    static void on_ack(jsCtx*, natsMsg* message, jsPubAck* ack, jsPubAckErr* error, void* closure) {
        NatsSink* self = static_cast<NatsSink*>(closure);
        {
            std::lock_guard<std::mutex> lock(self->mutex_);
            const auto found = self->waiting_.find(message);
            if (found != self->waiting_.end() && self->outcomes_ != nullptr) {
                Outcome& outcome = (*self->outcomes_)[found->second];
                if (ack != nullptr) {
                    outcome = Outcome::ack();
                    outcome.duplicate = ack->Duplicate;
                } else if (error != nullptr &&
                           (error->ErrCode == kMessageTooLarge || error->ErrCode == kHeadersTooLarge)) {
                    outcome = Outcome::dead(ack_error(message, error));
                } else {
                    outcome = Outcome::retry(ack_error(message, error));
                    if (error != nullptr && error->Err == NATS_NO_RESPONDERS)
                        self->recheck_.emplace_back(natsMsg_GetSubject(message));
                }
                self->waiting_.erase(found);
            }
            if (!self->waiting_.empty()) {
                natsMsg_Destroy(message);
                return;
            }
        }
        self->answered_.notify_all();
        natsMsg_Destroy(message);
    }

    static std::string ack_error(natsMsg* message, const jsPubAckErr* error) {
        if (error == nullptr) return "JetStream: no PubAck";
        if (error->Err == NATS_NO_RESPONDERS)
            return std::string("no JetStream stream takes subject ") + natsMsg_GetSubject(message);
        if (error->Err == NATS_TIMEOUT) return "JetStream: no PubAck in time";
        std::string text = "JetStream: " + status_text(error->Err);
        if (error->ErrCode != 0) text += " (error " + std::to_string(error->ErrCode) + ")";
        if (error->ErrText != nullptr && error->ErrText[0] != '\0') text += ": " + std::string(error->ErrText);
        return text;
    }

    // Until every PubAck is in, the deadline passes or the relay is told
    // to hurry; the messages still unanswered are then taken back from the
    // client, so that no late PubAck finds them.
    void await(Clock::time_point deadline) {
        std::unique_lock<std::mutex> lock(mutex_);
        // Woken when the last PubAck is in; every 50 ms to look at the stop.
        while (!waiting_.empty() && !aborted_.load() && Clock::now() < deadline)
            answered_.wait_for(lock, std::chrono::milliseconds(50));
        if (waiting_.empty()) return;
        const std::string why = aborted_.load() ? "the relay is stopping now"
                                                : "no PubAck within " +
                                                      std::to_string(timeout_.count()) + " ms";
        lock.unlock();
        natsMsgList pending;
        const bool listed = js_PublishAsyncGetPendingList(&pending, js_) == NATS_OK;
        lock.lock();
        for (const auto& [message, slot] : waiting_) (*outcomes_)[slot] = Outcome::retry(why);
        waiting_.clear();
        lock.unlock();
        if (listed) natsMsgList_Destroy(&pending);
    }

    // Beyond the lease and --http-timeout: the extension's backoff before a
    // retry (idempotency.retry_max_delay is 1 h by default, so the warning
    // holds for the first, short retries: 1 s doubling).
    static constexpr long long kRetryDelayAllowanceMs = 10000;

    NatsAddress address_;
    Millis timeout_;
    Millis connect_timeout_;
    Millis lease_;
    const Options& options_;
    const std::atomic<bool>& aborted_;
    SinkFault& fault_;
    std::unordered_map<std::string, Stream> streams_;  // by subject
    std::vector<std::string> recheck_;                 // subjects no stream answered for
    natsConnection* conn_ = nullptr;
    jsCtx* js_ = nullptr;
    bool published_ = false;  // js_ published at least once
    std::mutex mutex_;
    std::condition_variable answered_;
    std::vector<Outcome>* outcomes_ = nullptr;           // the group being published
    std::unordered_map<natsMsg*, std::size_t> waiting_;  // published, PubAck not yet in
};

class NatsTarget : public SinkTarget {
public:
    NatsTarget(NatsAddress address, const Options& options)
        : address_(std::move(address)), options_(options), timeout_(options.http_timeout) {}

    std::unique_ptr<Sink> open() override {
        return std::make_unique<NatsSink>(address_, options_, aborted_, fault_);
    }
    std::string fatal_error() const override { return fault_.reason(); }
    Millis max_delivery_time() const override { return timeout_; }
    std::size_t group_size() const override { return 10000; }
    void abort() override { aborted_ = true; }
    std::string describe() const override {
        return "NATS JetStream at " + redact_url(servers_text(address_)) + " (subjects " +
               (address_.prefix.empty() ? "" : address_.prefix + ".") + "<topic>)";
    }

private:
    NatsAddress address_;
    Options options_;
    Millis timeout_;
    std::atomic<bool> aborted_{false};
    SinkFault fault_;
};

}  // namespace

std::unique_ptr<SinkTarget> make_nats_target(const Options& options, std::string* error) {
    NatsAddress address;
    if (!parse_nats_url(options.sink, &address, error)) {
        *error = "--sink '" + redact_url(options.sink) + "': " + *error;
        return nullptr;
    }
    return std::make_unique<NatsTarget>(std::move(address), options);
}

}  // namespace idem::relay

#else

namespace idem::relay {

std::unique_ptr<SinkTarget> make_nats_target(const Options& options, std::string* error) {
    return sink_not_built(options, "NATS", "libnats-dev", error);
}

}  // namespace idem::relay

#endif
