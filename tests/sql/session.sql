-- Session windows: per key, rows less than the gap apart form one session
-- [first ts, last ts + gap), emitted once when the watermark passes its end.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, window_end, k, count(*) AS n, sum(v) AS total
FROM TABLE(SESSION(TABLE events PARTITION BY k, DESCRIPTOR(ts), INTERVAL '2' SECOND))
GROUP BY window_start, window_end, k;
