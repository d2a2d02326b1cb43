-- Top-N: each k's two highest v, as ROW_NUMBER ranks them, kept as the rows
-- arrive. Update mode, keyed by (k, rn): a rank whose row changed is
-- emitted again, and a row pushed out of the top two is overwritten by the
-- one that took its rank. The state holds at most two rows per k.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT k, rn, v, ts
FROM (SELECT k, v, ts, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) AS rn FROM events)
WHERE rn <= 2;
