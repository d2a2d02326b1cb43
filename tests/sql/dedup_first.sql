-- Deduplication keeping the first row of each k by event time (Flink's
-- idiom: ROW_NUMBER ordered by a watermarked column ascending, rn = 1) runs
-- in append mode: each k's first row is emitted once, when the watermark
-- passes it, and never replaced. The 0s row of epoch 2 is late (the
-- watermark is 3s) and dropped, so k = 2 keeps its 2s row.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT k, v, ts
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts) AS row_num FROM events)
WHERE row_num = 1;
