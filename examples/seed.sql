-- The seed pipeline: Spark's rate source (5 rows/s) → a projection → the
-- Kafka topic `updates`, one epoch per second.
--
--   sluice run examples/seed.sql      (Ctrl-C stops it cleanly)
--   sluice demo                       (starts Kafka, runs this, shows the output)

SET 'checkpoint.location' = './checkpoints/seed';
SET 'trigger.interval' = '1 second';

CREATE STREAM ticks WITH (connector = 'rate', 'rows_per_second' = '5');

CREATE STREAM updates WITH (
    connector = 'kafka',
    topic = 'updates',
    'bootstrap.servers' = 'localhost:9092',
    format = 'json'
);

INSERT INTO updates
SELECT value, timestamp, value % 10 AS bucket, value * 2 AS doubled
FROM ticks
WHERE value % 3 <> 0;
