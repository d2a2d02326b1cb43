CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT DATE_FORMAT(ts, 'yyyy-ww') AS week FROM events;
