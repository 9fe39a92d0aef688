#!/usr/bin/env bash
# The services the test suite needs beyond Python, from the distribution's packages: a PostgreSQL
# server (the job store's tests run against it as well as SQLite) and Chromium (the dashboard's
# browser test). Idempotent; prints the export line for the PostgreSQL URL the tests read.
#   eval "$(bash scripts/ci_services.sh)"
set -euo pipefail
{
    need=()
    # the server itself, not only the client tools (postgresql-common brings pg_ctlcluster with the client)
    compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
    command -v chromium >/dev/null 2>&1 || need+=(chromium)
    if ((${#need[@]})); then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need[@]}"
    fi
    version="$(basename "$(dirname "$(dirname "$(compgen -G "/usr/lib/postgresql/*/bin/postgres" | sort -V | tail -1)")")")"
    if ! pg_lsclusters -h | grep -q "^$version main"; then
        pg_createcluster "$version" main
    fi
    pg_ctlcluster "$version" main start 2>/dev/null || true
    for _ in $(seq 1 30); do
        pg_isready -q -h 127.0.0.1 -p 5432 && break
        sleep 1
    done
    su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='rlft'\"" | grep -q 1 \
        || su postgres -c "psql -qc \"CREATE ROLE rlft LOGIN PASSWORD 'rlft' CREATEDB\""
    su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='rlft_test'\"" | grep -q 1 \
        || su postgres -c "createdb -O rlft rlft_test"
} >&2
echo "export RLFT_TEST_POSTGRES_URL=postgresql+psycopg://rlft:rlft@127.0.0.1:5432/rlft_test"
