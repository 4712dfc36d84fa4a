#include "relay/nats_sink.hpp"

#include "relay/broker_address.hpp"
#include "relay/redact.hpp"

#ifdef IDEM_RELAY_NATS

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <strings.h>
#include <unordered_map>

#include <nats/nats.h>

#include "relay/broker_headers.hpp"
#include "relay/http_headers.hpp"
#include "relay/log.hpp"

namespace idem::relay {

namespace {

// Names JetStream reads itself (Nats-Msg-Id, Nats-Expected-*, ...): an
// event's own headers may not set them.
bool nats_reserved(std::string_view name) {
    return name.size() >= 5 && strncasecmp(name.data(), "nats-", 5) == 0;
}

std::string status_text(natsStatus status) { return natsStatus_GetText(status); }

class NatsSink : public GroupSink {
public:
    NatsSink(const NatsAddress& address, Millis timeout, Millis connect_timeout,
             const std::atomic<bool>& aborted)
        : address_(address), timeout_(timeout), connect_timeout_(connect_timeout),
          aborted_(aborted) {}

    ~NatsSink() override { disconnect(); }

    void deliver_group(const std::vector<const Event*>& events,
                       std::vector<Outcome>* outcomes) override {
        const Clock::time_point deadline = Clock::now() + timeout_;
        outcomes->assign(events.size(), Outcome::retry("not published"));
        std::string error;
        if (js_ == nullptr && !connect(&error)) {
            for (Outcome& outcome : *outcomes) outcome = Outcome::retry(error);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            outcomes_ = outcomes;
            waiting_.clear();
        }
        for (std::size_t i = 0; i < events.size(); ++i) publish(*events[i], i);
        await(deadline);
        std::lock_guard<std::mutex> lock(mutex_);
        outcomes_ = nullptr;
        waiting_.clear();
    }

private:
    bool connect(std::string* error) {
        natsOptions* options = nullptr;
        natsStatus status = natsOptions_Create(&options);
        if (status == NATS_OK) status = natsOptions_SetURL(options, address_.servers.c_str());
        if (status == NATS_OK) status = natsOptions_SetName(options, "idem-relay");
        if (status == NATS_OK)
            status = natsOptions_SetTimeout(options, static_cast<int64_t>(connect_timeout_.count()));
        // The client reconnects on its own, for ever; publishes made meanwhile
        // are buffered and their PubAcks awaited as usual.
        if (status == NATS_OK) status = natsOptions_SetMaxReconnect(options, -1);
        if (status == NATS_OK) status = natsOptions_SetReconnectWait(options, 250);
        if (status == NATS_OK) status = natsConnection_Connect(&conn_, options);
        natsOptions_Destroy(options);
        if (status != NATS_OK) {
            *error = "cannot connect to NATS at " + redact_url(address_.servers) + ": " +
                     status_text(status);
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
            natsMsgList pending;
            if (js_PublishAsyncGetPendingList(&pending, js_) == NATS_OK) natsMsgList_Destroy(&pending);
            jsCtx_Destroy(js_);
        }
        js_ = nullptr;
        if (conn_ != nullptr) natsConnection_Destroy(conn_);
        conn_ = nullptr;
    }

    void publish(const Event& event, std::size_t slot) {
        std::string subject, error;
        if (!nats_subject(address_.prefix, event.topic, &subject, &error)) {
            set_outcome(slot, Outcome::dead(error));
            return;
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
                status = natsMsgHeader_Set(message, "Nats-Msg-Id",
                                           encode_header_value(idempotency_key(event)).c_str());
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
                                             nats_GetLastError(nullptr)));
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
                } else {
                    outcome = Outcome::retry(ack_error(message, error));
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

    NatsAddress address_;
    Millis timeout_;
    Millis connect_timeout_;
    const std::atomic<bool>& aborted_;
    natsConnection* conn_ = nullptr;
    jsCtx* js_ = nullptr;
    std::mutex mutex_;
    std::condition_variable answered_;
    std::vector<Outcome>* outcomes_ = nullptr;           // the group being published
    std::unordered_map<natsMsg*, std::size_t> waiting_;  // published, PubAck not yet in
};

class NatsTarget : public SinkTarget {
public:
    NatsTarget(NatsAddress address, const Options& options)
        : address_(std::move(address)), timeout_(options.http_timeout),
          connect_timeout_(options.connect_timeout) {}

    std::unique_ptr<Sink> open() override {
        return std::make_unique<NatsSink>(address_, timeout_, connect_timeout_, aborted_);
    }
    Millis max_delivery_time() const override { return timeout_; }
    std::size_t group_size() const override { return 10000; }
    void abort() override { aborted_ = true; }
    std::string describe() const override {
        return "NATS JetStream at " + redact_url(address_.servers) + " (subjects " +
               (address_.prefix.empty() ? "" : address_.prefix + ".") + "<topic>)";
    }

private:
    NatsAddress address_;
    Millis timeout_;
    Millis connect_timeout_;
    std::atomic<bool> aborted_{false};
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
