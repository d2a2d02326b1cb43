CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE VIEW big AS SELECT k, v FROM events WHERE v > 1;
DROP VIEW big;
DROP VIEW IF EXISTS big;
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT k FROM big;
