-- A statement set: two INSERTs run as one query, both written every epoch.
SET 'trigger' = 'available-now';
CREATE STREAM events (k BIGINT, v BIGINT, ts TIMESTAMP)
    WITH (connector = 'files', path = 'data/events', format = 'json', 'max_files_per_epoch' = '1');
CREATE STREAM big WITH (connector = 'console');
CREATE STREAM per_key WITH (connector = 'console');
EXECUTE STATEMENT SET BEGIN
  INSERT INTO big SELECT k, v FROM events WHERE v > 4;
  INSERT INTO per_key SELECT k, count(*) AS n, sum(v) AS total FROM events GROUP BY k;
END;
