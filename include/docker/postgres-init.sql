-- the ivm catalog next to Airflow's metadata database (docker-compose.yaml)
CREATE ROLE ivm LOGIN PASSWORD 'ivm';
CREATE DATABASE ivm OWNER ivm;
-- the Hive metastore's database (the hive-metastore service makes its schema on first start)
CREATE DATABASE metastore OWNER ivm;
