SET 'trigger' = 'available-now';
SET 'output.mode' = 'update';
SET 'checkpoint.location' = '/work/main/target/bench-results/cdc-join-1/sluice-copy-1.cp';
CREATE STREAM accounts (id BIGINT NOT NULL, balance BIGINT) WITH (connector = 'kafka', topic = 'cdc-1796544944-accounts', 'bootstrap.servers' = '127.0.0.1:9092', format = 'debezium-json', 'max-records-per-epoch' = '200000', 'key.fields' = 'id');
CREATE STREAM orders (id BIGINT NOT NULL, total BIGINT) WITH (connector = 'kafka', topic = 'cdc-1796544944-orders', 'bootstrap.servers' = '127.0.0.1:9092', format = 'debezium-json', 'max-records-per-epoch' = '200000', 'key.fields' = 'id');
CREATE STREAM out WITH (connector = 'blackhole');
INSERT INTO out SELECT id, balance FROM accounts;
