-- Two stateful operators in one query (Nexmark q7's shape): per 5-second
-- window its highest v, joined back with the events that have it. The
-- aggregation emits a window once the watermark closes it; the join keeps
-- events until no window they fall in can still close.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT e.k, e.v, e.ts, m.window_end
FROM events e
JOIN (SELECT window_start, window_end, max(v) AS top
      FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND))
      GROUP BY window_start, window_end) m
  ON e.v = m.top AND e.ts BETWEEN m.window_end - INTERVAL '5' SECOND AND m.window_end;
