CREATE STREAM events (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
SET 'output.mode' = 'update';
INSERT INTO out
SELECT window_end, k, count(*) AS n
FROM TABLE(SESSION(TABLE events PARTITION BY k, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY window_start, window_end, k;
