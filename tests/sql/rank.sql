-- RANK and DENSE_RANK: rows that tie share a rank, so more than N rows may
-- rank within N. The output is keyed by the whole row: an epoch emits the
-- rows whose rank changed and deletes the rows at their old rank.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM out WITH (connector = 'console');
-- Per parity of k, the rows of the two highest k.
INSERT INTO out
SELECT p, k, v, r
FROM (SELECT p, k, v, DENSE_RANK() OVER (PARTITION BY p ORDER BY k DESC) AS r
      FROM (SELECT k % 2 AS p, k, v FROM events))
WHERE r <= 2;
