CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out (k BIGINT, total BIGINT) WITH (connector = 'console');
INSERT INTO out SELECT k, sum(v), count(*) FROM events GROUP BY k;
