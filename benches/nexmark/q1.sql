-- Nexmark q1: currency conversion, dollars to euros (a projection).
INSERT INTO nexmark_q1
SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid;
