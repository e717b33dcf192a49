#!/usr/bin/env bash
# Install the Debian packages the native stack and its tests run: PostgreSQL's server (initdb, pg_ctl), Redis,
# HAProxy (the gateway replicas' load balancer), Prometheus and its Alertmanager (the gateway's metrics, recording
# and alert rules; promtool unit-tests the rules), iproute2 (`ip netns`, the two-node fine-tune test) and curl.
#
#   scripts/install-services.sh     # installs only what is missing; a no-op when everything is there
#
# Nothing is started here and no system service is left enabled for our use: the tests and scripts/stack.sh run
# their own PostgreSQL clusters (initdb into their own folder, their own port and socket), Redis, HAProxy,
# Prometheus and Alertmanager processes. Debian's "main" PostgreSQL cluster is neither needed nor wanted, so it is
# not created; the services Debian's prometheus packages start (prometheus, prometheus-alertmanager and the node
# exporter they recommend, which --no-install-recommends leaves out) are stopped and disabled.
# Uses sudo when not root. Exits non-zero (the tests that need a package then skip, saying why) when there is no
# apt-get or no way to become root.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v haproxy >/dev/null || missing+=(haproxy)
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v ip >/dev/null || missing+=(iproute2)
command -v curl >/dev/null || missing+=(curl) # scripts/stack.sh's health checks
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "install-services: no apt-get on this machine; install ${missing[*]} yourself" >&2
  exit 1
fi
if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "install-services: not root and no password-less sudo; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "install-services: installing Debian's ${missing[*]} (apt-get)" >&2
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends)
"${sudo[@]}" apt-get update -q >/dev/null
if [[ " ${missing[*]} " == *" postgresql "* ]]; then
  # postgresql-common first: Debian creates (and, where services run, starts) a "main" cluster when the server
  # package is installed, unless its createcluster.conf says not to (the official postgres image does the same).
  "${apt[@]}" postgresql-common >/dev/null
  "${sudo[@]}" sed -ri 's/^#?\s*create_main_cluster\s*=.*$/create_main_cluster = false/' \
    /etc/postgresql-common/createcluster.conf
fi
"${apt[@]}" "${missing[@]}" >/dev/null
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || {
  echo "install-services: postgresql installed but no /usr/lib/postgresql/*/bin/initdb found" >&2
  exit 1
}
# Debian's maintainer scripts start (and enable) the packages' own services where an init system runs: ours are
# started by the tests and scripts/stack.sh on their own ports and folders, so these must not hold 9090/9093.
for unit in prometheus prometheus-alertmanager; do
  if [[ " ${missing[*]} " == *" $unit "* ]]; then
    if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
      "${sudo[@]}" systemctl disable --now "$unit" >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/$unit ]]; then
      "${sudo[@]}" /etc/init.d/"$unit" stop >/dev/null 2>&1 || true
      "${sudo[@]}" update-rc.d "$unit" disable >/dev/null 2>&1 || true
    fi
  fi
done
