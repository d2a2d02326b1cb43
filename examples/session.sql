-- Session windows over the events in tests/sql/data/events: per key, rows
-- less than 2 seconds apart form one session, emitted once the watermark
-- passes its end. Run from the repository root:
--
--   sluice run examples/session.sql
SET 'trigger' = 'available-now';
CREATE STREAM events (
    k  BIGINT,
    v  BIGINT,
    ts TIMESTAMP,
    WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH (connector = 'files', path = 'tests/sql/data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, window_end, k, count(*) AS n, sum(v) AS total
FROM TABLE(SESSION(TABLE events PARTITION BY k, DESCRIPTOR(ts), INTERVAL '2' SECOND))
GROUP BY window_start, window_end, k;
