-- Nexmark q8: monitor new users. The people who opened an auction in the
-- same 10-second window in which they registered, one row per such
-- auction (Beam's IdNameReserve): a window join of people and auctions,
-- whose state holds only the windows the watermark has not closed.
INSERT INTO nexmark_q8
SELECT p.id, p.name, a.reserve
FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) p
JOIN TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) a
  ON p.id = a.seller AND p.window_start = a.window_start;
