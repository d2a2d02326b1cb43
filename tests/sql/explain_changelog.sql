-- command: explain
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM auctions (id BIGINT, seller VARCHAR, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/auctions', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT count(*) AS auctions, sum(q.top) AS total, avg(q.top) AS mean
FROM (SELECT a.id, max(e.v) AS top
      FROM (SELECT id, ts, ts + INTERVAL '5' SECOND AS closes FROM auctions) a
      JOIN events e ON e.k = a.id
      WHERE e.ts BETWEEN a.ts AND a.closes
      GROUP BY a.id) q;
