#!/usr/bin/env bash
# The demo's tables loaded into the compose deployment (its PostgreSQL catalog, its warehouse volume):
#
#   docker compose exec airflow-scheduler /opt/airflow/include/docker/load-demo.sh
#
# then trigger ivm_refresh to materialize the views (docs/operations.md, "docker-compose"). One `ivm load` per table.
set -euo pipefail
data=/opt/airflow/include/views/demo/data
for spec in flight:flight.csv res:res.jsonl link:link.csv page_view:page_view.csv passenger:passenger.jsonl \
            companion:companion.csv trip:trip.jsonl; do
  ivm load "${spec%%:*}" "$data/${spec#*:}"
done
