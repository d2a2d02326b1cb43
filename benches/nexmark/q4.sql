-- Nexmark q4: average closing price per category. Each auction's highest
-- bid among the bids made while it was open (an interval join bounded by
-- two columns of the auction: a bid is kept until the watermark passes its
-- time, an auction until the watermark passes its expiry), then the average
-- of those per category. The per-auction maximum changes as bids arrive,
-- so the average takes each auction's old maximum back as it adds the new
-- one (a changelog between the two aggregations); update mode, keyed by
-- category. As Flink's Nexmark q4, which also averages auctions still open.
INSERT INTO nexmark_q4
SELECT q.category, avg(q.final) AS avg_final
FROM (SELECT a.id, a.category, max(b.price) AS final
      FROM auction a JOIN bid b ON a.id = b.auction
      WHERE b.date_time BETWEEN a.date_time AND a.expires
      GROUP BY a.id, a.category) q
GROUP BY q.category;
