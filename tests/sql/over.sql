-- OVER aggregations over event time: per key, the sum of v over the row
-- and the one before it, and how many rows of the key fall in the 5
-- seconds before it. A row comes out once the watermark passes it.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT k, v, ts,
       sum(v) OVER (PARTITION BY k ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS last2,
       count(*) OVER (PARTITION BY k ORDER BY ts
                      RANGE BETWEEN INTERVAL '5' SECOND PRECEDING AND CURRENT ROW) AS recent
FROM events;
