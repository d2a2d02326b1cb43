CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT k, sum(v) OVER (PARTITION BY k ORDER BY ts) AS running FROM events;
