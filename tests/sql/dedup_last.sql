-- Deduplication keeping the last row of each k (Flink's idiom: ROW_NUMBER
-- ordered by event time descending, rn = 1). Update mode keyed by k: an
-- epoch emits the k whose latest row changed. A row older than the one kept
-- (the 0s row of epoch 2) does not replace it.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT k, v, ts
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts DESC) AS row_num FROM events)
WHERE row_num = 1;
