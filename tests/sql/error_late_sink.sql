CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'late.sink' = 'nowhere');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, count(*) AS n
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY window_start, window_end;
