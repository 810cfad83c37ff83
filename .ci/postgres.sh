#!/usr/bin/env bash
# Install (Debian packages) and start PostgreSQL, create a test database, print its URL on stdout.
# Run as root. Idempotent: reuses a running cluster and an existing database.
set -euo pipefail
DB=${PIPEPLAN_PG_DB:-pipeplan_test}
USER_=${PIPEPLAN_PG_USER:-pipeplan}
PASS=${PIPEPLAN_PG_PASSWORD:-pipeplan}
if ! command -v pg_lsclusters >/dev/null 2>&1 || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
VER=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$VER main$"; then
  pg_createcluster "$VER" main >&2
fi
PORT=$(pg_lsclusters -h | awk -v v="$VER" '$1==v && $2=="main" {print $3}')
if ! pg_lsclusters -h | awk -v v="$VER" '$1==v && $2=="main" {print $4}' | grep -q online; then
  pg_ctlcluster "$VER" main start >&2
fi
for _ in $(seq 1 30); do
  su postgres -c "pg_isready -q -h 127.0.0.1 -p $PORT" && break
  sleep 1
done
su postgres -c "psql -q -p $PORT -tc \"SELECT 1 FROM pg_roles WHERE rolname='$USER_'\"" | grep -q 1 \
  || su postgres -c "psql -q -p $PORT -c \"CREATE ROLE $USER_ LOGIN PASSWORD '$PASS' CREATEDB\"" >&2
su postgres -c "psql -q -p $PORT -tc \"SELECT 1 FROM pg_database WHERE datname='$DB'\"" | grep -q 1 \
  || su postgres -c "createdb -p $PORT -O $USER_ $DB" >&2
echo "postgresql://$USER_:$PASS@127.0.0.1:$PORT/$DB"
