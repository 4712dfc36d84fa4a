// Sinks: where events go. A SinkTarget is the configured destination; it
// opens one Sink per delivery thread (a Sink is used by one thread only).
// The one that --sink names is made in factory.hpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "relay/event.hpp"
#include "relay/options.hpp"

namespace idem::relay {

class Sink {
public:
    virtual ~Sink() = default;
    // Delivers one event; never throws. Ack only once the sink has it.
    virtual Outcome deliver(const Event& event) = 0;
    // Delivers events of distinct keys together, so that they may go out in
    // any order (a broker's batch of publishes whose confirms come back
    // asynchronously), or with a target whose groups keep order a key's run
    // too (SinkTarget::groups_keep_order); (*outcomes)[i] is events[i]'s.
    // Never throws. By default one at a time.
    virtual void deliver_group(const std::vector<const Event*>& events,
                               std::vector<Outcome>* outcomes);
};

// A sink whose deliveries go out in groups (a broker's batch of publishes):
// one event is a group of one.
class GroupSink : public Sink {
public:
    Outcome deliver(const Event& event) final;
    void deliver_group(const std::vector<const Event*>& events,
                       std::vector<Outcome>* outcomes) override = 0;
};

class SinkTarget {
public:
    virtual ~SinkTarget() = default;
    virtual std::unique_ptr<Sink> open() = 0;
    // The longest one delivery may take (an event is not started when its
    // lease would run out before that).
    virtual Millis max_delivery_time() const = 0;
    // Events one delivery thread hands to deliver_group at once (1: one by
    // one). A group takes at most max_delivery_time() as a whole.
    virtual std::size_t group_size() const { return 1; }
    // Whether a group may hold a run of one key: a sink whose group goes out
    // in the order given and never delivers an event after one that it did
    // not (one write for the whole group, all or nothing). Otherwise a group
    // holds events of distinct keys only, and a run goes out one at a time.
    virtual bool groups_keep_order() const { return false; }
    // Set once the sink cannot deliver anything any more (stdout closed): the
    // relay stops.
    virtual std::string fatal_error() const { return {}; }
    // Ends the deliveries in progress as soon as it can (a second stop
    // signal); they come back as retryable failures.
    virtual void abort() {}
    virtual std::string describe() const = 0;
};

// For a sink this build has no client library of: nullptr, with *error
// naming the Debian package to build it with.
std::unique_ptr<SinkTarget> sink_not_built(const Options& options, const char* what,
                                           const char* package, std::string* error);

}  // namespace idem::relay
