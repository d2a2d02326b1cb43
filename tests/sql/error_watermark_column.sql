CREATE STREAM events (
    k  BIGINT,
    ts TIMESTAMP,
    WATERMARK FOR tss AS tss - INTERVAL '1' SECOND
) WITH (connector = 'files', path = 'data/events', format = 'json');
