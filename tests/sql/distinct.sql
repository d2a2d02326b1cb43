-- SELECT DISTINCT emits each distinct row once, the first time it is seen.
-- These rows carry no event time, so no row is late (the 0s row of epoch 2
-- counts) and the state keeps every distinct row.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT DISTINCT k, v > 4 AS big FROM events;
