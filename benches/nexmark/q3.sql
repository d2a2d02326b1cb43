-- Nexmark q3: local item suggestion. The sellers in Oregon, Idaho or
-- California of auctions in category 10: an inner join of auctions with
-- people without a time bound, so both sides stay in the state for ever
-- (after the filters, which run before the join).
INSERT INTO nexmark_q3
SELECT p.name, p.city, p.state, a.id
FROM auction a JOIN person p ON a.seller = p.id
WHERE a.category = 10 AND (p.state = 'OR' OR p.state = 'ID' OR p.state = 'CA');
