-- Nexmark q6 as RisingWave writes it (Flink cannot run its own q6, an OVER window over an updating input): the average selling price per seller over its last 10 closed auctions.
CREATE TABLE nexmark_q6 (
    seller BIGINT,
    avg_price BIGINT
) WITH ('connector' = 'blackhole');
INSERT INTO nexmark_q6
SELECT Q.seller,
       AVG(Q.final) OVER (PARTITION BY Q.seller ORDER BY Q.`dateTime`
                          ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)
FROM (
    SELECT MAX(B.price) AS final, A.seller, A.expires AS `dateTime`
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
    GROUP BY A.id, A.seller, A.expires
) AS Q;
