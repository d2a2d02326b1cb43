-- An aggregation over an interval join, grouped by the auction's time. An
-- event may join its auction up to 5 s after it, so a group closes only
-- once the watermark is 5 s past the auction: ann's third event (at 0:05,
-- read in the second epoch) is in its one row, emitted in the third epoch,
-- when the watermark reaches 0:08. cy's auction (0:08) is still open.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH (connector = 'files', path = 'data/late_pairs', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM auctions (id BIGINT, seller VARCHAR, ts TIMESTAMP, WATERMARK FOR ts AS ts)
    WITH (connector = 'files', path = 'data/auctions', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT a.ts, a.seller, count(*) AS n, sum(e.v) AS total
FROM events e JOIN auctions a
  ON e.k = a.id AND e.ts BETWEEN a.ts AND a.ts + INTERVAL '5' SECOND
GROUP BY a.ts, a.seller;
