// When work in progress is expected to be done, from how long the recent
// completions of its scope took. A claim answered in_progress reports it as
// retry_after, so that a client (an HTTP Retry-After) tries again when the
// holder has likely finished, not when its lease would run out: a 300 ms
// job under a 30 s lease is retried in a second, not in thirty.
//
// The durations are smoothed as TCP smooths round-trip times (RFC 6298):
// a mean and a mean deviation, each moved an eighth and a quarter of the
// way to every new sample; the typical duration is the mean plus twice the
// deviation.
#pragma once

#include "core/time.hpp"

namespace idem {

struct DurationEstimate {
    Micros mean = 0;
    Micros deviation = 0;
    bool known = false;  // at least one completion observed
};

// The estimate after one more completion that took `duration` (a negative
// duration, from a clock step, is ignored).
DurationEstimate observe_duration(DurationEstimate estimate, Micros duration);

// How long until a holder that has worked for `elapsed` is expected to be
// done: the typical duration less `elapsed`; once that has passed, a
// quarter of the typical duration (it is overdue: look again soon); never
// more than `lease_left`, the longest it can still hold the key. Without an
// estimate, `lease_left`.
Micros expected_remaining(const DurationEstimate& estimate, Micros elapsed, Micros lease_left);

}  // namespace idem
