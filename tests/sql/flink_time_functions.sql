-- Flink's time functions: TIMESTAMPADD and TIMESTAMPDIFF take their unit
-- as a bare word, TO_TIMESTAMP reads text by a Java pattern, and
-- UNIX_TIMESTAMP and TO_TIMESTAMP_LTZ go between times and epoch numbers.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '3');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out
SELECT k, TIMESTAMPADD(HOUR, 2, ts) AS later,
       TIMESTAMPDIFF(SECOND, TO_TIMESTAMP('01/01/2026', 'dd/MM/yyyy'), ts) AS seconds,
       UNIX_TIMESTAMP(CAST(ts AS VARCHAR)) - UNIX_TIMESTAMP('2026-01-01 00:00:00') AS also,
       TO_TIMESTAMP_LTZ(v, 0) AS v_time
FROM events WHERE k = 1;
