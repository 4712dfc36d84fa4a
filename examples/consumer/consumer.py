"""A Kafka-style consumer that applies each message once in effect.

The broker delivers at least once (see broker.py for how this simulated one
does it): the same message comes again after a producer retry, after a
rebalance, after the consumer died before committing. The consumer makes the
effect happen once with the extension's inbox. For each batch of records
from one partition, in ONE database transaction:

  1. idempotency.inbox_receive(message_id, source) for every record: true the
     first time the message is seen; false for a duplicate, whether it
     committed before, came earlier in this batch, or is being applied by
     another consumer right now (the call then waits for that transaction to
     end, and answers false if it committed);
  2. the effect of the first-time messages;
  3. the partition's next offset.

They commit together or not at all: a consumer that dies mid-batch leaves
no effect, no inbox row and no offset behind, and the batch is delivered
again.
"""
import psycopg2
import psycopg2.errors

# Failures that mean "run the same transaction again".
RETRYABLE = (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure)


class PointsConsumer:
    """Grants loyalty points for paid orders (topic `orders`)."""

    def __init__(self, conn, group, name, before_commit=None):
        self.conn = conn                    # transactions here (autocommit off)
        self.group = group                  # the consumer group: one inbox per group
        self.name = name
        self.before_commit = before_commit  # a hook for tests (fault injection)
        self.stats = {"deliveries": 0, "duplicates": 0, "applied": 0, "batches": 0, "retries": 0}
        self.stopping = False

    def source(self, topic):
        # Inbox rows are keyed by (source, message_id). Two groups consuming
        # one topic each need to see every message once: one source each.
        return f"{self.group}:{topic}"

    # The broker's rebalance listener: a partition this consumer gains starts
    # at the offset committed with the effects of the records before it.
    def on_assigned(self, topic, partitions):
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                """SELECT partition, next_offset FROM consumer_offsets
                    WHERE group_id = %s AND topic = %s AND partition = ANY(%s)""",
                (self.group, topic, partitions))
            committed = dict(cur.fetchall())
        return {p: committed.get(p, 0) for p in partitions}

    def run(self, broker, max_records=50, idle=lambda: None):
        """Polls and processes until stopped; `idle` is called when a poll
        brings nothing (it may set self.stopping)."""
        while not self.stopping:
            partition, records = broker.poll(max_records)
            if records:
                self.process(records)
            else:
                idle()

    def process(self, records):
        for attempt in range(1, 4):
            try:
                applied = self._process_once(records)
            except RETRYABLE:
                self.stats["retries"] += 1
                if attempt == 3:
                    raise
                continue
            self.stats["applied"] += applied
            self.stats["batches"] += 1
            return

    def _process_once(self, records):
        topic, partition = records[0].topic, records[0].partition
        source = self.source(topic)
        with self.conn, self.conn.cursor() as cur:   # commits, or rolls back on an exception
            # Receive in message_id order: two consumers whose batches share
            # messages (a zombie and its successor, or two copies of one
            # message in two partitions) then wait for each other in one
            # direction only, never in a cycle.
            first = set()
            for record in sorted(records, key=lambda r: (r.message_id, r.offset)):
                cur.execute("SELECT idempotency.inbox_receive(%s, %s)", (record.message_id, source))
                self.stats["deliveries"] += 1
                if cur.fetchone()[0]:
                    first.add(record.offset)
                else:
                    self.stats["duplicates"] += 1

            for record in records:                   # effects in log order
                if record.offset in first:
                    self.apply(cur, record)

            # A zombie that commits after its successor must not move the
            # offset back: GREATEST.
            cur.execute(
                """INSERT INTO consumer_offsets (group_id, topic, partition, next_offset)
                   VALUES (%s, %s, %s, %s)
                   ON CONFLICT (group_id, topic, partition) DO UPDATE
                   SET next_offset = GREATEST(consumer_offsets.next_offset, EXCLUDED.next_offset)""",
                (self.group, topic, partition, records[-1].offset + 1))
            if self.before_commit:
                self.before_commit()
        return len(first)

    def apply(self, cur, record):
        order = record.value
        cur.execute(
            """INSERT INTO points_ledger (message_id, order_id, customer, points, applied_by)
               VALUES (%s, %s, %s, %s, %s)""",
            (record.message_id, order["order_id"], order["customer"], order["points"], self.name))
