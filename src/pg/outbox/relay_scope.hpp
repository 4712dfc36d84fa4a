// Which topics the calling role may work on as a relay: claim, ack, nack,
// release and redrive. The extension's owner, superusers and roles with no
// row in relay_grants may work on every topic; a role granted topics with
// grant_relay() (or a member of such a role) only on those. Callers hold an
// SPI connection.
//
// A relay calls as the same role every time, so the backend keeps the last
// role's allowed topics and their hashed set, and reads the grants again
// only when the rows that give them are other versions than the kept ones:
// a call then costs a look at the grant rows, whatever the length of their
// lists, and each topic checked is one probe of the set.
#pragma once

#include "pg/boundary/postgres.hpp"
#include "pg/outbox/topic_set.hpp"

namespace idem::pg {

// The topics the calling role may work on: limited to a grant's topics,
// with their set (kept until the next call of relay_scope()), or not.
using RelayScope = TopicLimit;

RelayScope relay_scope();

// The topics a claim may take: the requested ones (NULL: all it may), each
// checked against the scope; with the grant's own topics, their set too.
TopicLimit claimable_topics(const RelayScope& scope, Datum requested, bool has_requested);

// Raises 42501 when one of the events `ids` belongs to a topic outside the
// scope (the first such event's, in id order); `what` names the call in the
// message.
void check_event_topics(const RelayScope& scope, Datum ids, const char* what);

// Raises 42501 when `topic` is outside the scope.
void check_topic(const RelayScope& scope, const text* topic, const char* what);

}  // namespace idem::pg
