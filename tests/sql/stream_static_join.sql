-- A stream joined with a static table (a CSV file): stateless, each epoch's
-- rows join the table; LEFT keeps the events with no name.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE TABLE names (id BIGINT, name VARCHAR) WITH (path = 'data/names.csv', format = 'csv');
CREATE STREAM out WITH (connector = 'console');
INSERT INTO out SELECT e.k, e.v, n.name FROM events e LEFT JOIN names n ON e.k = n.id;
