SET 'checkpoint.location' = '/tmp/tmp.YZRzvlJkLq/load';
-- Writes Nexmark's events into one Kafka topic in the layout Flink's
-- nexmark repository reads (ddl_kafka.sql): event_type, then a person, an
-- auction or a bid as a nested JSON object (the other two null), with
-- Flink's generator's bid channel and URL. nexmark-flink-1796600048, 127.0.0.1:9092, 1000000
-- and 10000 (events per second of event time) are filled in by whoever
-- runs it. Each epoch writes one second of event time: the three
-- statements write their rows one after the other, so an epoch's span is
-- how far out of time order the topic is, and it must stay under the
-- watermark's delay of 4 s, or readers drop rows as late.
SET 'trigger' = 'available-now';
CREATE STREAM person_events WITH (connector = 'nexmark', table = 'person', generator = 'flink',
    pace = 'none', 'max-events' = '1000000', 'events-per-second' = '10000',
    'max-events-per-epoch' = '10000');
CREATE STREAM auction_events WITH (connector = 'nexmark', table = 'auction', generator = 'flink',
    pace = 'none', 'max-events' = '1000000', 'events-per-second' = '10000',
    'max-events-per-epoch' = '10000');
CREATE STREAM bid_events WITH (connector = 'nexmark', table = 'bid', generator = 'flink',
    pace = 'none', 'max-events' = '1000000', 'events-per-second' = '10000',
    'max-events-per-epoch' = '10000');
CREATE TABLE nexmark (
    event_type INT,
    person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR, city VARCHAR,
               state VARCHAR, `dateTime` TIMESTAMP(3), extra VARCHAR>,
    auction ROW<id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT,
                reserve BIGINT, `dateTime` TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT,
                category BIGINT, extra VARCHAR>,
    bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
            `dateTime` TIMESTAMP(3), extra VARCHAR>
) WITH ('connector' = 'kafka', 'topic' = 'nexmark-flink-1796600048', 'properties.bootstrap.servers' = '127.0.0.1:9092',
        'format' = 'json');
EXECUTE STATEMENT SET BEGIN
INSERT INTO nexmark (event_type, person)
SELECT 0, named_struct('id', id, 'name', name, 'emailAddress', email_address,
                       'creditCard', credit_card, 'city', city, 'state', state,
                       'dateTime', date_time, 'extra', extra)
FROM person_events;
INSERT INTO nexmark (event_type, auction)
SELECT 1, named_struct('id', id, 'itemName', item_name, 'description', description,
                       'initialBid', initial_bid, 'reserve', reserve, 'dateTime', date_time,
                       'expires', expires, 'seller', seller, 'category', category,
                       'extra', extra)
FROM auction_events;
INSERT INTO nexmark (event_type, bid)
SELECT 2, named_struct('auction', auction, 'bidder', bidder, 'price', price, 'channel', channel,
                       'url', url, 'dateTime', date_time, 'extra', extra)
FROM bid_events;
END;
