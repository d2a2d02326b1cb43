CREATE TABLE names (id BIGINT, name VARCHAR) WITH (path = 'data/names.csv', fromat = 'csv');
