CREATE STREAM events (
    k  BIGINT,
    ts TIMESTAMP,
    WATERMARK FOR ts AS ts + INTERVAL '1' SECOND
) WITH (connector = 'files', path = 'data/events', format = 'json');
