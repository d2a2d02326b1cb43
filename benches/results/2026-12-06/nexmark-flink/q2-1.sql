SET 'checkpoint.location' = '/work/main/benches/results/2026-12-06/nexmark-flink/cp-q2-1';
SET 'trigger' = 'available-now';
-- Nexmark's events as Flink's nexmark repository declares them: one Kafka
-- topic of nested JSON (event_type, then a person, an auction or a bid),
-- the event time computed from whichever is there, 4 seconds of lateness.
-- nexmark-flink-1796556495 and 127.0.0.1:9092 are filled in by whoever runs the files.
CREATE TABLE kafka (
    event_type INT,
    person ROW<
        id BIGINT,
        name VARCHAR,
        emailAddress VARCHAR,
        creditCard VARCHAR,
        city VARCHAR,
        state VARCHAR,
        `dateTime` TIMESTAMP(3),
        extra VARCHAR>,
    auction ROW<
        id BIGINT,
        itemName VARCHAR,
        description VARCHAR,
        initialBid BIGINT,
        reserve BIGINT,
        `dateTime` TIMESTAMP(3),
        expires TIMESTAMP(3),
        seller BIGINT,
        category BIGINT,
        extra VARCHAR>,
    bid ROW<
        auction BIGINT,
        bidder BIGINT,
        price BIGINT,
        channel VARCHAR,
        url VARCHAR,
        `dateTime` TIMESTAMP(3),
        extra VARCHAR>,
    `dateTime` AS
        CASE
            WHEN event_type = 0 THEN person.`dateTime`
            WHEN event_type = 1 THEN auction.`dateTime`
            ELSE bid.`dateTime`
        END,
    WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH (
    'connector' = 'kafka',
    'topic' = 'nexmark-flink-1796556495',
    'properties.bootstrap.servers' = '127.0.0.1:9092',
    'properties.group.id' = 'nexmark',
    'scan.startup.mode' = 'earliest-offset',
    'sink.partitioner' = 'round-robin',
    'format' = 'json', 'max-records-per-epoch' = '250000'
);
-- The three Nexmark streams as views over the one table of events.
CREATE VIEW person AS
SELECT person.id, person.name, person.emailAddress, person.creditCard, person.city,
       person.state, `dateTime`, person.extra
FROM kafka WHERE event_type = 0;

CREATE VIEW auction AS
SELECT auction.id, auction.itemName, auction.description, auction.initialBid,
       auction.reserve, `dateTime`, auction.expires, auction.seller, auction.category,
       auction.extra
FROM kafka WHERE event_type = 1;

CREATE VIEW bid AS
SELECT bid.auction, bid.bidder, bid.price, bid.channel, bid.url, `dateTime`, bid.extra
FROM kafka WHERE event_type = 2;
-- Nexmark q2 as Flink's nexmark repository writes it: Selection: the bids on every 123rd auction.
CREATE TABLE nexmark_q2 (
    auction BIGINT,
    price BIGINT
) WITH ('connector' = 'blackhole');
INSERT INTO nexmark_q2
SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
