-- A Kafka stream's option is checked when a query reads the stream; the
-- mistake is shown at the option in CREATE STREAM, not at the INSERT.
CREATE STREAM bids (id BIGINT, price BIGINT)
    WITH (connector = 'kafka', topic = 'bids', 'bootstrap.servers' = '127.0.0.1:9',
          format = 'jsn');
CREATE STREAM out WITH (connector = 'kafka', topic = 'out', 'bootstrap.servers' = '127.0.0.1:9');
INSERT INTO out SELECT id, price FROM bids;
