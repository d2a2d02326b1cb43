-- Flink's INSERT: a view names a query, and a sink's columns are filled in
-- order whatever the query calls them, with Flink's implicit casts (a
-- count into BIGINT, a DOUBLE into DECIMAL, text into VARCHAR). An INSERT
-- may list the columns it fills; the others are NULL.
SET 'trigger' = 'available-now';
SET 'output.mode' = 'update';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE TEMPORARY VIEW big (key, amount) AS SELECT k, v FROM events WHERE v > 1;
CREATE STREAM totals (bucket BIGINT, half DECIMAL(23, 3), label VARCHAR, n BIGINT)
    WITH (connector = 'console');
CREATE STREAM labels (bucket BIGINT, half DECIMAL(23, 3), label VARCHAR)
    WITH (connector = 'console');
EXECUTE STATEMENT SET BEGIN
INSERT INTO totals
SELECT key, sum(amount) * 0.5, CONCAT('key ', CAST(key AS VARCHAR)), count(DISTINCT amount)
FROM big GROUP BY key;
INSERT INTO labels (label, bucket) SELECT DISTINCT CONCAT('key ', CAST(key AS VARCHAR)), key FROM big;
END;
