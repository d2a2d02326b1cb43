-- An interval join: each event joins the auction whose id is its k when it
-- happened within 5 seconds after the auction opened. LEFT: an event with
-- no auction is emitted with nulls once the watermark shows none can come.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM auctions (id BIGINT, seller VARCHAR, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/auctions', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT e.k, e.v, e.ts, a.seller
FROM events e LEFT JOIN auctions a
  ON e.k = a.id AND e.ts BETWEEN a.ts AND a.ts + INTERVAL '5' SECOND;
