CREATE STREAM events (k BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', formt = 'json');
