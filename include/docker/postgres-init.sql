-- the ivm catalog next to Airflow's metadata database (docker-compose.yaml)
CREATE ROLE ivm LOGIN PASSWORD 'ivm';
CREATE DATABASE ivm OWNER ivm;
