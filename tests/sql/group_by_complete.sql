-- A GROUP BY in complete mode: every epoch emits the whole result table.
SET 'trigger' = 'available-now';
SET 'output.mode' = 'complete';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT k, count(*) AS n, avg(v) AS mean, array_agg(v ORDER BY v) AS vs FROM events GROUP BY k;
