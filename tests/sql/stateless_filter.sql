-- A stateless query: every epoch's rows, filtered and projected.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT k, v * 10 AS v10, date_trunc('second', ts) AS at FROM events WHERE v > 4;
