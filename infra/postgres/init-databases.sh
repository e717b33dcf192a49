#!/usr/bin/env bash
# One database and one login role per service of the stack: mlflow (tracking + registry), prefect (the Prefect
# server) and serving (the gateway's keys, conversations, usage and request log).
#
# The postgres image runs this once, on the first start of an empty data volume, from /docker-entrypoint-initdb.d
# (infra/compose.yaml mounts it there), as the superuser over the local socket. The passwords come from the
# environment (infra/.env), never from a file in the repository. To run it by hand against another server:
#   PGHOST=... PGUSER=postgres MLFLOW_DB_PASSWORD=... PREFECT_DB_PASSWORD=... SERVING_DB_PASSWORD=... \
#     bash infra/postgres/init-databases.sh
# Changing a password in .env later does not change it here: the script does not run again on a non-empty volume
# (ALTER ROLE ... PASSWORD by hand, or start from a fresh volume).
set -euo pipefail

create() {
  local name=$1 password=$2
  # psql variables quote the identifier (:"name") and the literal (:'password'): no SQL built by string pasting
  psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-${PGUSER:-postgres}}" --dbname postgres \
    --set name="$name" --set password="$password" <<'SQL'
CREATE ROLE :"name" LOGIN PASSWORD :'password';
CREATE DATABASE :"name" OWNER :"name";
-- each service sees its own database only
REVOKE ALL ON DATABASE :"name" FROM PUBLIC;
SQL
  echo "init-databases: created database and role '$name'"
}

create mlflow "${MLFLOW_DB_PASSWORD:?set MLFLOW_DB_PASSWORD}"
create prefect "${PREFECT_DB_PASSWORD:?set PREFECT_DB_PASSWORD}"
create serving "${SERVING_DB_PASSWORD:?set SERVING_DB_PASSWORD}"
# the maintenance database is the superuser's alone
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-${PGUSER:-postgres}}" --dbname postgres \
  -c "REVOKE CONNECT ON DATABASE postgres FROM PUBLIC"
