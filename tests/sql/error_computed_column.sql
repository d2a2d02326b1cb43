CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP, doubled AS w * 2)
    WITH (connector = 'files', path = 'data/events', format = 'json');
