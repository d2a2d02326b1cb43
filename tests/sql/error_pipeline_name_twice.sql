SET 'pipeline.name' = 'ticks-to-console';
CREATE STREAM ticks WITH (connector = 'rate', 'rows_per_second' = '5');
CREATE STREAM a WITH (connector = 'console');
CREATE STREAM b WITH (connector = 'console');
INSERT INTO a SELECT value FROM ticks;
INSERT INTO b SELECT value * 2 AS doubled FROM ticks;
