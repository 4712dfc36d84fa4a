// Where a claim's scan of the ready queue starts. Claims hand out the
// oldest ready events first, so the events they hand out and the ones
// acked after leave dead entries at the low end of the ready indexes until
// a vacuum: a scan from the start would read all of them every time. A
// claim therefore starts a little below where the last claim of the same
// source (a topic, or every topic) found its first ready event: its mark,
// minus a margin of 100 ms.
//
// Why nothing is skipped. A ready event becomes visible with a ready_at
// below a claim's mark only when its transaction wrote that ready_at well
// before its commit became visible (a long transaction, a slow commit).
// Such a transaction, when its commit is visible, publishes the lowest
// ready_at it wrote in a small ring in shared memory; a claim reads the
// ring before its scan and starts at the lowest ready_at published since
// its mark was taken. A prepared transaction is published once it is no
// longer in progress. Without the shared memory (the library not
// preloaded), or when the ring overflowed, a claim scans from the start.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// --- writers -------------------------------------------------------------
// The current transaction writes a ready event due at `ready_at`.
void note_ready_written(Micros ready_at);

// --- claims ---------------------------------------------------------------
struct ScanStart {
    Micros from;          // read ready events with ready_at >= from
    std::uint64_t token;  // for scan_found
};
// Where a claim of `topic` (nullptr: every topic) starts.
ScanStart scan_start(const text* topic);
// The claim's scan of `topic` found its first ready event at `first_ready`
// (the claim's own clock when it found none): the next claim's mark.
void scan_found(const text* topic, const ScanStart& start, Micros first_ready);

// Called from _PG_init: the transaction callbacks, and (while preloading)
// the shared memory.
void install_ready_floor_callbacks();
// Its part of the shared memory (listed in module.cpp): size and set-up (under
// AddinShmemInitLock).
Size ready_floor_size();
void init_ready_floor();

}  // namespace idem::pg
