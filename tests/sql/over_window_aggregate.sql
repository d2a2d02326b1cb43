-- An OVER window over a windowed aggregation, ordered by the window's end: each
-- closed window's count beside the sum of it and the key's window before it.
-- The aggregation emits each window once, when the watermark closes it, so
-- its rows reach the OVER window in window_end's order.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT k, window_end, n, sum(n) OVER (PARTITION BY k ORDER BY window_end ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS last2
FROM (SELECT k, window_end, count(*) AS n FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '4' SECOND)) GROUP BY k, window_start, window_end) w;
