-- Tumbling windows over the rate source: every 2 seconds of event time, how
-- many ticks of each parity, emitted once per window when the watermark
-- (1 second behind the newest tick) passes the window's end.
--
--   sluice run examples/tumble.sql      (Ctrl-C stops it)
CREATE STREAM ticks (
    WATERMARK FOR timestamp AS timestamp - INTERVAL '1' SECOND
) WITH (connector = 'rate', 'rows_per_second' = '20');
CREATE STREAM out WITH (connector = 'console');
SET 'trigger.interval' = '1 second';
INSERT INTO out
SELECT window_start, window_end, value % 2 AS parity, count(*) AS n, sum(value) AS total
FROM TABLE(TUMBLE(TABLE ticks, DESCRIPTOR(timestamp), INTERVAL '2' SECOND))
GROUP BY window_start, window_end, value % 2;
