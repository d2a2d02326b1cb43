-- Nexmark q5: hot items. Per 10-second window, sliding every 2 seconds,
-- the auctions with the most bids: bids counted per auction and window,
-- the highest count per window, and the counts joined with it. Four
-- stateful operators in one query (the counting runs twice, once per path).
-- With the window's end, which Beam's q5 leaves out.
INSERT INTO nexmark_q5
SELECT c.auction, c.num, m.window_end
FROM (SELECT auction, count(*) AS num, window_start, window_end
      FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
      GROUP BY auction, window_start, window_end) c
JOIN (SELECT max(num) AS maxn, window_start, window_end
      FROM (SELECT count(*) AS num, window_start, window_end
            FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
            GROUP BY auction, window_start, window_end)
      GROUP BY window_start, window_end) m
  ON c.window_start = m.window_start AND c.window_end = m.window_end AND c.num >= m.maxn;
