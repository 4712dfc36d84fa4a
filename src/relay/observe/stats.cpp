#include "relay/observe/stats.hpp"

#include <cmath>
#include <cstdio>

namespace idem::relay {

namespace {

std::string number(double value) {
    char text[64];
    snprintf(text, sizeof text, "%.9g", value);
    return text;
}

std::string label_value(const std::string& value) {
    std::string out;
    for (const char c : value) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

void metric(std::string& out, const char* name, const char* type, const char* help,
            const std::string& labels, const std::string& value) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
    out += name;
    out += '{' + labels + "} " + value + '\n';
}

}  // namespace

void Histogram::observe(double seconds) {
    if (!(seconds >= 0)) seconds = 0;
    std::size_t bucket = 0;
    while (bucket < kBounds.size() && seconds > kBounds[bucket]) ++bucket;
    buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_micros_.fetch_add(static_cast<std::uint64_t>(std::llround(seconds * 1e6)),
                          std::memory_order_relaxed);
}

void Histogram::render(std::string& out, const std::string& name,
                       const std::string& labels) const {
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i <= kBounds.size(); ++i) {
        cumulative += buckets_[i].load(std::memory_order_relaxed);
        const std::string le = i < kBounds.size() ? number(kBounds[i]) : "+Inf";
        out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) +
               '\n';
    }
    out += name + "_sum{" + labels + "} " +
           number(static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6) + '\n';
    out += name + "_count{" + labels + "} " + std::to_string(cumulative) + '\n';
}

void Stats::observe_delay_max(double seconds) {
    double seen = delay_max.load();
    while (seconds > seen && !delay_max.compare_exchange_weak(seen, seconds)) {
    }
}

std::string Stats::prometheus(const std::string& relay) const {
    const std::string labels = "relay=\"" + label_value(relay) + "\"";
    std::string out;
    auto counter = [&](const char* name, const char* help, const std::atomic<std::uint64_t>& v) {
        metric(out, name, "counter", help, labels, std::to_string(v.load()));
    };
    counter("idem_relay_claimed_total", "Events claimed from the outbox.", claimed);
    counter("idem_relay_delivered_total", "Events delivered and acked.", delivered);
    counter("idem_relay_retried_total", "Deliveries that failed and will be retried.", retried);
    counter("idem_relay_dead_total", "Events nacked as dead (final failure or attempts exhausted).",
            dead);
    counter("idem_relay_skipped_total",
            "Claimed events not attempted (their lease would run out first, they did not fit "
            "in --max-in-flight-bytes, or the relay was stopping).",
            skipped);
    counter("idem_relay_released_total",
            "Events not attempted or not judged, released back to pending without counting an "
            "attempt.",
            released);
    counter("idem_relay_duplicates_total",
            "Delivered events the broker already had (a JetStream PubAck marked duplicate: a "
            "repeat dropped by the stream).",
            duplicates);
    counter("idem_relay_claims_total", "outbox_claim calls.", claims);
    counter("idem_relay_notifications_total", "Notifications received on idempotency_outbox.",
            notifications);
    counter("idem_relay_reconnects_total", "Database connections made again after a loss.",
            reconnects);
    counter("idem_relay_db_errors_total", "Failed database calls.", db_errors);
    metric(out, "idem_relay_in_flight", "gauge", "Events claimed and not yet acked or nacked.",
           labels, std::to_string(in_flight.load()));
    metric(out, "idem_relay_in_flight_bytes", "gauge",
           "Bytes of payload and headers of the events in flight.", labels,
           std::to_string(in_flight_bytes.load()));
    metric(out, "idem_relay_healthy", "gauge",
           "1 unless the relay is stopping on a failure (see /healthz).", labels,
           healthy.load() ? "1" : "0");
    metric(out, "idem_relay_db_connected", "gauge",
           "1 while the database connections (every one of --connections) are up.",
           labels, connected() ? "1" : "0");
    if (lag_known.load())
        metric(out, "idem_relay_outbox_lag_seconds", "gauge",
               "Age of the oldest undelivered, not dead event of the relay's topics "
               "(idempotency.outbox_lag).",
               labels, number(lag_seconds.load()));
    out += "# HELP idem_relay_delivery_seconds Time one delivery spent in the sink.\n"
           "# TYPE idem_relay_delivery_seconds histogram\n";
    delivery_seconds.render(out, "idem_relay_delivery_seconds", labels);
    out += "# HELP idem_relay_delivery_delay_seconds Time from enqueue to ack.\n"
           "# TYPE idem_relay_delivery_delay_seconds histogram\n";
    delay_seconds.render(out, "idem_relay_delivery_delay_seconds", labels);
    return out;
}

}  // namespace idem::relay
