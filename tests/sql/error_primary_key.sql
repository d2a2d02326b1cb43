CREATE TABLE users (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id))
    WITH ('connector' = 'upsert-kafka', 'topic' = 'users', 'properties.bootstrap.servers' = 'localhost:1');
