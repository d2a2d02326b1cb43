CREATE STREAM events (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, count(*) AS n
FROM TABLE(TUMBLE(TABLE evnts, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY window_start;
