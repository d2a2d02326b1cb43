-- Nexmark q13 as Flink's nexmark repository writes it: Bounded side input join: each bid with a value from a file, looked up as of processing time.
CREATE TABLE side_input (
    key BIGINT,
    `value` VARCHAR
) WITH (
    'connector.type' = 'filesystem',
    'connector.path' = '{side_input}',
    'format.type' = 'csv'
);
CREATE TABLE nexmark_q13 (
    auction BIGINT,
    bidder BIGINT,
    price BIGINT,
    `dateTime` TIMESTAMP(3),
    `value` VARCHAR
) WITH ('connector' = 'blackhole');
INSERT INTO nexmark_q13
SELECT B.auction, B.bidder, B.price, B.`dateTime`, S.`value`
FROM (SELECT *, PROCTIME() AS p_time FROM bid) B
JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S
ON mod(B.auction, 10000) = S.key;
