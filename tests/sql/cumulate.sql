-- Cumulating windows (Flink's CUMULATE): per 10-second window, the count
-- so far at every 5 seconds. Each row is in every window of its 10 seconds
-- that ends after it; a window is emitted once the watermark passes its end.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT w.window_start, w.window_end, count(*) AS n, sum(w.v) AS total
FROM TABLE(CUMULATE(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND)) AS w
GROUP BY w.window_start, w.window_end;
