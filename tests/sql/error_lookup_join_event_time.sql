CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE TABLE names (id BIGINT, name VARCHAR) WITH ('connector' = 'filesystem', 'path' = 'data/names.csv', 'format' = 'csv', 'header' = 'true');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT e.k, n.name FROM events e
JOIN names FOR SYSTEM_TIME AS OF e.ts AS n ON e.k = n.id;
