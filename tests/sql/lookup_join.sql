-- Flink's lookup join: each event looks its name up in a file as of the
-- time it is processed (a PROCTIME() column), declared as Flink's older
-- releases spell a filesystem table; as Flink's csv format, the file has no
-- header line (its first line, 1,one, is a row).
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE TABLE names (id BIGINT, name VARCHAR) WITH (
    'connector.type' = 'filesystem', 'connector.path' = 'data/names_no_header.csv',
    'format.type' = 'csv');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT e.k, e.v, n.name
FROM (SELECT *, PROCTIME() AS p_time FROM events) e
JOIN names FOR SYSTEM_TIME AS OF e.p_time AS n ON e.k = n.id;
