-- Nexmark's events in Flink's layout, as Flink's nexmark repository reads
-- them: one stream of event_type and a nested person, auction or bid
-- (the other two NULL), with Flink's generator's bid channel and URL.
-- benches/nexmark/flink/load.sql writes the same rows (with `extra`) to
-- a Kafka topic.
SET 'trigger' = 'available-now';
CREATE STREAM person_events WITH (connector = 'nexmark', table = 'person', generator = 'flink',
    pace = 'none', 'max-events' = '12');
CREATE STREAM auction_events WITH (connector = 'nexmark', table = 'auction', generator = 'flink',
    pace = 'none', 'max-events' = '12');
CREATE STREAM bid_events WITH (connector = 'nexmark', table = 'bid', generator = 'flink',
    pace = 'none', 'max-events' = '12');
CREATE TABLE nexmark (
    event_type INT,
    person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, city VARCHAR, dateTime TIMESTAMP(3)>,
    auction ROW<id BIGINT, itemName VARCHAR, initialBid BIGINT, seller BIGINT, category BIGINT,
                dateTime TIMESTAMP(3), expires TIMESTAMP(3)>,
    bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
            dateTime TIMESTAMP(3)>
) WITH ('connector' = 'console');
EXECUTE STATEMENT SET BEGIN
INSERT INTO nexmark (event_type, person)
SELECT 0, named_struct('id', id, 'name', name, 'emailAddress', email_address, 'city', city,
                       'dateTime', date_time)
FROM person_events;
INSERT INTO nexmark (event_type, auction)
SELECT 1, named_struct('id', id, 'itemName', item_name, 'initialBid', initial_bid,
                       'seller', seller, 'category', category, 'dateTime', date_time,
                       'expires', expires)
FROM auction_events;
INSERT INTO nexmark (event_type, bid)
SELECT 2, named_struct('auction', auction, 'bidder', bidder, 'price', price, 'channel', channel,
                       'url', url, 'dateTime', date_time)
FROM bid_events;
END;
