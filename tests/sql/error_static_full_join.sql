CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE TABLE names (id BIGINT, name VARCHAR) WITH (path = 'data/names.csv', format = 'csv');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT e.k, n.name FROM events e RIGHT JOIN names n ON e.k = n.id;
