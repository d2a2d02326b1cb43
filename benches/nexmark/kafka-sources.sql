-- The Nexmark streams as `sluice nexmark load` writes them to Kafka.
-- {prefix}, {bootstrap} and {source_options} (more options, e.g. an epoch
-- cap) are replaced by the harness; event time is date_time, with
-- Nexmark's usual 4-second watermark delay.
CREATE STREAM person (id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR,
    city VARCHAR, state VARCHAR, date_time TIMESTAMP, extra VARCHAR,
    WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
WITH (connector = 'kafka', topic = '{prefix}-person', 'bootstrap.servers' = '{bootstrap}'{source_options});
CREATE STREAM auction (id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT,
    reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT,
    extra VARCHAR, WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
WITH (connector = 'kafka', topic = '{prefix}-auction', 'bootstrap.servers' = '{bootstrap}'{source_options});
CREATE STREAM bid (auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP,
    extra VARCHAR, WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND)
WITH (connector = 'kafka', topic = '{prefix}-bid', 'bootstrap.servers' = '{bootstrap}'{source_options});
