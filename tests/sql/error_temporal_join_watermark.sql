CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP,
    WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM versions (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT e.k, e.v, r.v AS version
FROM events e JOIN versions FOR SYSTEM_TIME AS OF e.ts AS r ON e.k = r.k;
