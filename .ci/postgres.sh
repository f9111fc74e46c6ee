#!/usr/bin/env bash
# Install PostgreSQL from Debian's packages if it is missing, start a throwaway server on loopback,
# and print the SQLAlchemy URL the catalog tests use (IVM_TEST_POSTGRES_URL).
set -euo pipefail
PGPORT="${IVM_PGPORT:-55432}"
PGDATA="${IVM_PGDATA:-/tmp/ivm-ci-pgdata}"
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "installing PostgreSQL from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
if ! "$bindir/pg_isready" -q -h 127.0.0.1 -p "$PGPORT"; then
  # initdb and the server refuse to run as root: use the postgres account the package creates
  id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql postgres
  rm -rf "$PGDATA" && mkdir -p "$PGDATA" && chown postgres "$PGDATA"
  su postgres -s /bin/sh -c "'$bindir/initdb' -D '$PGDATA' -U postgres -A trust >/dev/null"
  su postgres -s /bin/sh -c "'$bindir/pg_ctl' -D '$PGDATA' -l '$PGDATA/server.log' -w \
      -o \"-h 127.0.0.1 -p $PGPORT -k /tmp\" start >/dev/null"
fi
"$bindir/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -qtc "SELECT 1 FROM pg_roles WHERE rolname='ivm'" | grep -q 1 \
  || "$bindir/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -qc "CREATE ROLE ivm LOGIN SUPERUSER PASSWORD 'ivm'" >&2
echo "postgresql+psycopg2://ivm:ivm@127.0.0.1:$PGPORT/postgres"
