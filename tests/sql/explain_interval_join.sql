-- command: explain
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM auctions (id BIGINT, seller VARCHAR, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/auctions', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT e.k, a.seller FROM events e JOIN auctions a
  ON e.k = a.id AND e.ts BETWEEN a.ts AND a.ts + INTERVAL '5' SECOND;
