-- Nexmark q0: pass-through. Measures reading, decoding and writing alone.
INSERT INTO nexmark_q0
SELECT auction, bidder, price, date_time, extra FROM bid;
