-- A sink with declared columns takes a query whose columns match them.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out (k BIGINT, total BIGINT) WITH (connector = 'console');
INSERT INTO out SELECT k, sum(v) AS total FROM events WHERE k = 1 GROUP BY k;
