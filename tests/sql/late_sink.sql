-- 'late.sink': the rows a windowed aggregation drops as late go to a
-- stream of their own, in the epoch that dropped them. Epoch 2's 0s row is
-- behind the watermark (3s) and epoch 3's 9s row behind 11s: each shows
-- among the late rows, and neither is counted in a window.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1',
          'late.sink' = 'late_events');
CREATE STREAM late_events WITH (connector = 'console');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT window_start, window_end, count(*) AS n, sum(v) AS total
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND))
GROUP BY window_start, window_end;
