-- Hopping windows in update mode: every epoch emits the windows its rows
-- changed; a row is counted in each of the size/slide windows holding it.
SET 'trigger' = 'available-now';
SET 'output.mode' = 'update';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT w.window_start, w.window_end, count(*) AS n, max(w.v) AS top
FROM TABLE(HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND)) AS w
GROUP BY w.window_start, w.window_end;
