-- Tumbling windows in append mode: each window is emitted once, in the
-- epoch whose input moves the watermark past its end; late rows are dropped.
SET 'trigger' = 'available-now';
CREATE STREAM events (
    k  BIGINT,
    v  BIGINT,
    ts TIMESTAMP,
    WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, window_end, k, count(*) AS n, sum(v) AS total
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY window_start, window_end, k;
