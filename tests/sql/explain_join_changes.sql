-- command: explain
-- A full outer join of two aggregations whose rows change: per key, the
-- events' count beside the highest v among events over 5. A key with
-- events but none over 5 is padded with nulls until one arrives; a
-- console shows each epoch's upserts (the rows whose value changed).
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT c.k AS counted, c.n, t.k AS topped, t.top
FROM (SELECT k, count(*) AS n FROM events GROUP BY k) c
FULL JOIN (SELECT k, max(v) AS top FROM events WHERE v > 5 GROUP BY k) t
  ON c.k = t.k;
