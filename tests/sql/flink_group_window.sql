-- Flink's group-window syntax: TUMBLE, HOP or SESSION in GROUP BY, with
-- their _START, _END and _ROWTIME in the SELECT. A SESSION is kept per
-- value of the other GROUP BY columns. Each window is emitted once, when
-- the watermark passes its end, as in Flink.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM tumbling (k BIGINT, n BIGINT, wstart TIMESTAMP(3), wend TIMESTAMP(3), rowtime TIMESTAMP(3))
    WITH (connector = 'console');
CREATE STREAM sliding (total BIGINT, wend TIMESTAMP(3)) WITH (connector = 'console');
CREATE STREAM sessions (k BIGINT, n BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3))
    WITH (connector = 'console');
EXECUTE STATEMENT SET BEGIN
INSERT INTO tumbling
SELECT E.k, count(*), TUMBLE_START(E.ts, INTERVAL '5' SECOND), TUMBLE_END(E.ts, INTERVAL '5' SECOND),
       TUMBLE_ROWTIME(E.ts, INTERVAL '5' SECOND)
FROM events E GROUP BY E.k, TUMBLE(E.ts, INTERVAL '5' SECOND);
INSERT INTO sliding
SELECT sum(v), HOP_END(ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
FROM events GROUP BY HOP(ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND);
INSERT INTO sessions
SELECT k, count(*), SESSION_START(ts, INTERVAL '3' SECOND), SESSION_END(ts, INTERVAL '3' SECOND)
FROM events GROUP BY k, SESSION(ts, INTERVAL '3' SECOND);
END;
