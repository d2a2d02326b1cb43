-- Nexmark q2: selection, the bids on every 123rd auction (a filter).
INSERT INTO nexmark_q2
SELECT auction, price FROM bid WHERE auction % 123 = 0;
