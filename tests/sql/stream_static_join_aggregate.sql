-- Aggregating a stream–static join: the join runs per epoch, the GROUP BY
-- incrementally over its output.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE TABLE names WITH (path = 'data/names.csv', format = 'csv');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT n.name, count(*) AS n, sum(e.v) AS total
FROM events e JOIN names n ON e.k = n.id
GROUP BY n.name;
