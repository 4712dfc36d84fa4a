-- Created by the application role (`app`, which owns the database).

-- The simulated broker: a partitioned, append-only log, like a Kafka topic.
-- Every copy of one message carries the same message_id (a header the
-- producer sets), at whatever partition and offset the copy landed.
CREATE SCHEMA broker;
CREATE TABLE broker.records (
    topic      text   NOT NULL,
    partition  int    NOT NULL,
    "offset"   bigint NOT NULL,
    message_id text   NOT NULL,
    value      jsonb  NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);

-- The consumer's committed positions, written in the same transaction as
-- the effects of the records before them (the "offsets stored outside the
-- broker" pattern): on assignment a consumer seeks to them.
CREATE TABLE consumer_offsets (
    group_id    text   NOT NULL,
    topic       text   NOT NULL,
    partition   int    NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);

-- The effect: loyalty points granted per order. Append-only, so that two
-- consumers applying different messages never wait on each other. In
-- production you would add UNIQUE (message_id) as a second line of defence;
-- it is left out so that the load test would see a message applied twice.
CREATE TABLE points_ledger (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id text   NOT NULL,
    order_id   text   NOT NULL,
    customer   text   NOT NULL,
    points     int    NOT NULL,
    applied_by text   NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
