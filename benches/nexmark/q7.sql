-- Nexmark q7: highest bid. Per 10-second window its highest price, joined
-- back with the bids of that window that have it: a windowed aggregation
-- feeding an interval join, two stateful operators in one query.
INSERT INTO nexmark_q7
SELECT b.auction, b.price, b.bidder, b.date_time, b.extra
FROM bid b
JOIN (SELECT window_start, window_end, max(price) AS maxprice
      FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
      GROUP BY window_start, window_end) m
  ON b.price = m.maxprice
 AND b.date_time BETWEEN m.window_end - INTERVAL '10' SECOND AND m.window_end;
