-- The nested events of flink_nested.sql counted per auction in 10 s windows
-- (a query of its own: two queries of one file print in either order).
SET 'trigger' = 'available-now';
CREATE TABLE events (
    event_type INT,
    person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, dateTime TIMESTAMP(3)>,
    bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, dateTime TIMESTAMP(3)>,
    dateTime AS CASE WHEN event_type = 0 THEN person.dateTime ELSE bid.dateTime END,
    WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'files', 'path' = 'data/nested', 'format' = 'json');
CREATE VIEW person AS
SELECT person.id, person.name, person.emailAddress, dateTime FROM events WHERE event_type = 0;
CREATE VIEW bid AS
SELECT bid.auction, bid.bidder, bid.price, bid.channel, dateTime FROM events WHERE event_type = 2;
-- A window over a view, as Flink's Nexmark queries write them.
SET 'output.mode' = 'update';
CREATE TABLE counts (auction BIGINT, window_end TIMESTAMP(3), num BIGINT) WITH ('connector' = 'console');
INSERT INTO counts
SELECT auction, window_end, count(*)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;
