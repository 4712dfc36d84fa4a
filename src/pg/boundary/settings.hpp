// The idempotency.* settings (GUCs). Durations are held in the unit their
// GUC declares; the accessors give microseconds.
#pragma once

#include "core/time.hpp"

namespace idem::pg::settings {

extern int default_lease_ms;
extern int max_lease_ms;
extern int retention_s;      // the result's retention
extern int key_retention_s;  // the tombstone's, from the key's finish
extern int max_attempts;
extern int retry_base_delay_ms;
extern int retry_max_delay_ms;
extern int stuck_after_ms;
extern int outbox_max_attempts;
extern int outbox_run_length;
extern int outbox_retention_s;
extern int inbox_retention_s;
extern int max_value_bytes;
extern int max_steps;       // finished steps a key may hold
extern int max_step_bytes;  // the largest result of one step
extern int naptime_ms;
extern int launcher_naptime_ms;
extern int purge_batch;
extern int purge_naptime_ms;
extern int max_notifiers;
extern int purge_pause_ms;
extern int max_databases;
extern int max_gauges;
extern bool worker_enabled;
extern bool expire_on_disconnect;
extern bool log_transitions;
extern bool force_drop;
extern bool outbox_notify;
// Off only in the differential test: row writes and locks through SPI.
extern bool direct_table_access;

void define();

inline Micros ms(int value) { return static_cast<Micros>(value) * kMillisecond; }
inline Micros seconds(int value) { return static_cast<Micros>(value) * kSecond; }

}  // namespace idem::pg::settings
