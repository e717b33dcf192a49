#!/usr/bin/env bash
# Install Debian's PostgreSQL server binaries for the Postgres integration test (tests/integration/test_postgres.py).
#
#   scripts/install-postgres.sh     # no-op when /usr/lib/postgresql/*/bin/initdb exists; apt-get otherwise
#
# The test runs a throwaway cluster of its own (initdb into a temporary folder, its own port and socket), so the
# package's "main" cluster is neither needed nor wanted: it is not created, and nothing is started here.
# Uses sudo when not root. Exits non-zero (the test then skips, saying why) when there is no apt-get or no way
# to become root.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-postgres: no apt-get on this machine; install PostgreSQL's server binaries (initdb, pg_ctl) yourself" >&2
  exit 1
fi
if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "install-postgres: not root and no password-less sudo; run: sudo apt-get install -y postgresql" >&2
  exit 1
fi

echo "install-postgres: installing Debian's postgresql (apt-get)" >&2
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
"${sudo[@]}" apt-get update -q >/dev/null
# postgresql-common first: Debian creates (and, where services run, starts) a "main" cluster when the server
# package is installed, unless its createcluster.conf says not to (the official postgres image does the same).
"${apt[@]}" postgresql-common >/dev/null
"${sudo[@]}" sed -ri 's/^#?\s*create_main_cluster\s*=.*$/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf
"${apt[@]}" postgresql >/dev/null
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || {
  echo "install-postgres: postgresql installed but no /usr/lib/postgresql/*/bin/initdb found" >&2
  exit 1
}
