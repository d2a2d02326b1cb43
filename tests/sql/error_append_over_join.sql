SET 'output.mode' = 'append';
CREATE STREAM events (k BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM auctions (id BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/auctions', format = 'json');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT a.ts, count(*) AS n FROM events e JOIN auctions a ON e.k = a.id GROUP BY a.ts;
