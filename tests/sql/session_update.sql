-- SESSION windows in update mode: each epoch emits the sessions its rows
-- changed; when a row bridges two sessions, the merged session is emitted
-- and the two it replaced are taken back (deleted by their key).
SET 'trigger' = 'available-now';
SET 'output.mode' = 'update';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, window_end, k, count(*) AS n, sum(v) AS total
FROM TABLE(SESSION(TABLE events PARTITION BY k, DESCRIPTOR(ts), INTERVAL '3' SECOND))
GROUP BY window_start, window_end, k;
