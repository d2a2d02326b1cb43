CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json');
CREATE STREAM out WITH (connector = 'console');
EXECUTE STATEMENT SET BEGIN
  INSERT INTO out SELECT k FROM events;
  SELECT k FROM events;
END;
