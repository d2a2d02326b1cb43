-- Flink's functions with Flink's meaning: DATE_FORMAT takes Java patterns
-- (DataFusion alone would read 'yyyy-MM-dd HH:mm' as a chrono pattern and
-- return the wrong text), and a GROUP BY on it counts per minute of the day.
SET 'trigger' = 'available-now';
SET 'output.mode' = 'update';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm') AS minute, HOUR(ts) AS h, MOD(k, 2) AS parity,
       count(*) AS n, max(SPLIT_INDEX(CONCAT('a,', CAST(v AS VARCHAR)), ',', 1)) AS top
FROM events
GROUP BY DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm'), HOUR(ts), MOD(k, 2);
