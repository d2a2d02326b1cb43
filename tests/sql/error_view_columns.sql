CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE VIEW pairs (a, b, c) AS SELECT k, v FROM events;
