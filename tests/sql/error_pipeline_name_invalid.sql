SET 'pipeline.name' = 'orders per minute';
CREATE STREAM ticks WITH (connector = 'rate', 'rows_per_second' = '5');
CREATE STREAM a WITH (connector = 'console');
INSERT INTO a SELECT value FROM ticks;
