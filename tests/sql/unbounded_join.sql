-- An inner join without a time bound (Flink's regular join, the shape of
-- Nexmark q3): every event joins every auction with its id, whenever
-- either arrives, so both sides stay in the state for ever.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM auctions (id BIGINT, seller VARCHAR, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/auctions', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT e.k, e.v, a.seller
FROM events e JOIN auctions a ON e.k = a.id
WHERE a.seller <> 'nobody';
