-- Hopping windows over the rate source: 6-second windows starting every
-- 2 seconds, so each tick counts in three windows. Update mode emits every
-- window each epoch it changes; append (the default) would wait for the
-- watermark to pass each window's end.
--
--   sluice run examples/hop.sql      (Ctrl-C stops it)
CREATE STREAM ticks (
    WATERMARK FOR timestamp AS timestamp - INTERVAL '1' SECOND
) WITH (connector = 'rate', 'rows_per_second' = '10');
CREATE STREAM out WITH (connector = 'console');
SET 'trigger.interval' = '1 second';
SET 'output.mode' = 'update';
INSERT INTO out
SELECT window_start, window_end, count(*) AS n, min(value) AS first, max(value) AS last
FROM TABLE(HOP(TABLE ticks, DESCRIPTOR(timestamp), INTERVAL '2' SECOND, INTERVAL '6' SECOND))
GROUP BY window_start, window_end;
