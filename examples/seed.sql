-- The seed pipeline: Spark's rate source (5 rows/s) → a GROUP BY in update
-- mode → the Kafka topic `updates`, exactly once, one epoch per second.
-- Each epoch emits the buckets that changed, keyed by bucket: the topic is
-- an upsert stream a read_committed consumer sees each update of once.
--
--   sluice run examples/seed.sql      (Ctrl-C stops it cleanly)
--   sluice demo                       (starts Kafka, runs this, shows the output)

SET 'pipeline.name' = 'seed';             -- the query's identity in Kafka
SET 'checkpoint.location' = './checkpoints/seed';
SET 'trigger.interval' = '1 second';
SET 'output.mode' = 'update';

CREATE STREAM ticks WITH (connector = 'rate', 'rows_per_second' = '5');

CREATE STREAM updates WITH (
    connector = 'kafka',
    topic = 'updates',
    'bootstrap.servers' = 'localhost:9092',
    format = 'json'          -- update mode: messages are keyed by the group key, bucket
);

INSERT INTO updates
SELECT value % 4 AS bucket, count(*) AS ticks, sum(value) AS total, max(timestamp) AS last_tick
FROM ticks
GROUP BY value % 4;
