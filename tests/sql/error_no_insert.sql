-- Streams declared, nothing started: sluice run says so and exits 2.
SET 'checkpoint.location' = '/tmp/never-used';
CREATE STREAM events (k BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
