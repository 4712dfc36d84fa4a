"""A simulated Kafka-style broker: just enough of a consumer client to
show what the inbox is for. Not part of the pattern; consumer.py is.

The log lives in table broker.records (topic, partition, offset). Like a
real broker it delivers at least once:

- The producer is at-least-once too: a message it retried is in the log
  several times, at other offsets, in other partitions (no key, so each copy
  went to whichever partition the partitioner picked).
- Rebalances: every `rebalance_every` seconds the group's partitions are
  dealt out anew (a new generation). A member that gains a partition asks
  its listener where to start (the offset committed in the database); the
  member that lost it may still be finishing the batch it fetched, so both
  process the same records at the same time, as a "zombie" does in Kafka.

Members are numbered 0..members-1; which partitions a member owns in a
generation is computed the same way by every member, so there is no
coordinator process.
"""
import random
import time
from collections import namedtuple

Record = namedtuple("Record", "topic partition offset message_id value")


class SimulatedConsumer:
    def __init__(self, conn, topic, member, members, listener, rebalance_every=0.5):
        self.conn = conn                # autocommit connection for reading the log
        self.topic = topic
        self.member = member
        self.members = members
        self.listener = listener        # on_assigned(partitions) -> {partition: offset}
        self.rebalance_every = rebalance_every
        self.generation = None
        self.positions = {}             # partition -> next offset to fetch
        self.rebalances = 0
        with conn.cursor() as cur:
            cur.execute("SELECT DISTINCT partition FROM broker.records WHERE topic = %s ORDER BY 1", (topic,))
            self.partitions = [row[0] for row in cur.fetchall()]

    def _assignment(self):
        generation = int(time.time() / self.rebalance_every)
        dealt = list(self.partitions)
        random.Random(generation).shuffle(dealt)
        return generation, set(dealt[self.member::self.members])

    def _rebalance(self):
        generation, mine = self._assignment()
        if generation == self.generation:
            return
        self.generation = generation
        for partition in set(self.positions) - mine:      # revoked
            del self.positions[partition]
        gained = mine - set(self.positions)
        if gained:
            self.positions.update(self.listener.on_assigned(self.topic, sorted(gained)))
        self.rebalances += 1

    def poll(self, max_records):
        """Returns (partition, records) for one partition with records to
        fetch, advancing its fetch position; or (None, []) when there is
        nothing. Like Kafka, the fetch position is not the committed one: a
        batch that is not committed is not fetched again by this member
        unless it seeks back (see seek)."""
        self._rebalance()
        owned = sorted(self.positions, key=lambda p: random.random())
        with self.conn.cursor() as cur:
            for partition in owned:
                cur.execute(
                    """SELECT topic, partition, "offset", message_id, value FROM broker.records
                        WHERE topic = %s AND partition = %s AND "offset" >= %s
                        ORDER BY "offset" LIMIT %s""",
                    (self.topic, partition, self.positions[partition], max_records))
                records = [Record(*row) for row in cur.fetchall()]
                if records:
                    self.positions[partition] = records[-1].offset + 1
                    return partition, records
        return None, []

    def seek(self, partition, offset):
        if partition in self.positions:
            self.positions[partition] = offset
