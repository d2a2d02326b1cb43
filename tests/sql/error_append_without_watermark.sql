CREATE STREAM events (k BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
SET 'output.mode' = 'append';
INSERT INTO out
SELECT window_start, count(*) AS n
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY window_start;
