-- An interval join of two rate streams: each tock is matched with the ticks
-- of the same value modulo 10 from the two seconds before it. The bound lets
-- the join forget a tick once the watermark shows no tock can match it.
--
--   sluice run examples/interval_join.sql      (Ctrl-C stops it)
CREATE STREAM ticks (WATERMARK FOR timestamp AS timestamp - INTERVAL '1' SECOND)
    WITH (connector = 'rate', 'rows_per_second' = '10');
CREATE STREAM tocks (WATERMARK FOR timestamp AS timestamp - INTERVAL '1' SECOND)
    WITH (connector = 'rate', 'rows_per_second' = '2');
CREATE STREAM out WITH (connector = 'console');
SET 'trigger.interval' = '1 second';
INSERT INTO out
SELECT o.value AS tock, t.value AS tick, t.timestamp AS tick_time, o.timestamp AS tock_time
FROM ticks t JOIN tocks o
  ON t.value % 10 = o.value % 10
 AND o.timestamp BETWEEN t.timestamp AND t.timestamp + INTERVAL '2' SECOND;
