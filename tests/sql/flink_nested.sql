-- Flink's DDL: one table of nested JSON events with ROW columns, a column
-- computed from them with a watermark over it, fields reached with a dot
-- and named by their field, identifiers keeping their case (emailAddress),
-- and views over the table named after what they hold.
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
CREATE TABLE people (id BIGINT, emailAddress VARCHAR, dateTime TIMESTAMP(3)) WITH ('connector' = 'console');
CREATE TABLE bids (auction BIGINT, price BIGINT, channel VARCHAR, at_second BIGINT) WITH ('connector' = 'console');
EXECUTE STATEMENT SET BEGIN
INSERT INTO people SELECT id, emailAddress, dateTime FROM person;
INSERT INTO bids SELECT auction, price, UPPER(channel), SECOND(dateTime) FROM bid WHERE price > 100;
END;
