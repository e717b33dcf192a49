#!/usr/bin/env bash
# The production stack of infra/compose.yaml as native processes on one machine, without Docker: Debian's
# PostgreSQL, Redis, HAProxy, Prometheus and Alertmanager, MLflow, the Prefect server and workers and the gateway from the project's .venv, on the
# same ports and with the same settings, bound to 127.0.0.1.
#
#   scripts/stack.sh up       # start what is not running, wait until healthy, register the schedules on the pool
#   scripts/stack.sh status   # one line per service: running or not, pid, address, health
#   scripts/stack.sh down     # stop everything it started (the data stays in $STACK_HOME)
#   scripts/stack.sh env      # export lines for a shell that runs lifecycle commands against the stack
#   scripts/stack.sh plan     # each compose service's native command (tests/unit/infra/test_stack_native.py
#   scripts/stack.sh config   # compares it, and the config below, with infra/compose.yaml: they cannot drift)
#   scripts/stack.sh monitoring  # write and print Prometheus' and Alertmanager's configs with the native addresses
#
#   eval "$(scripts/stack.sh env)"
#   lifecycle run --config "$LIFECYCLE_CONFIG" --set evals.gate=configs/gates/default.yaml
#
# Settings, from the environment: STACK_HOME (./.lifecycle/stack: databases, logs, pid files, secrets, the
# lifecycle homes), STACK_WORKERS (1), STACK_POSTGRES_PORT (5432), STACK_REDIS_PORT (6379), STACK_MLFLOW_PORT
# (5000), STACK_PREFECT_PORT (4200), GATEWAY_PORT (3000: HAProxy, the clients' address), STACK_GATEWAY_REPLICA_PORT
# (3001: gateway replica N listens on 3001+N-1), STACK_WORKER_HEALTH_PORT (8080: worker N answers on
# 8080+N-1), STACK_PROMETHEUS_PORT (9090), STACK_ALERTMANAGER_PORT (9093), STACK_WATCH_PORT (9095: the champion
# watch), STACK_BASE_CONFIG (configs/production.yaml). Secrets: infra/.env when it exists (the file compose
# reads); any left empty are generated once into $STACK_HOME/secrets.env (mode 600) and reused.
# Needs Debian's postgresql, redis-server, haproxy, prometheus and prometheus-alertmanager (scripts/install-services.sh) and .venv (scripts/setup-env.sh).
# docs/production.md maps each compose service to its process here.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${LIFECYCLE_VENV:-$repo/.venv}
home=$(realpath -m "${STACK_HOME:-$repo/.lifecycle/stack}")
workers=${STACK_WORKERS:-1}
pg_port=${STACK_POSTGRES_PORT:-5432}
redis_port=${STACK_REDIS_PORT:-6379}
mlflow_port=${STACK_MLFLOW_PORT:-5000}
prefect_port=${STACK_PREFECT_PORT:-4200}
gateway_port=${GATEWAY_PORT:-3000}
replica_port=${STACK_GATEWAY_REPLICA_PORT:-3001}
gateways=2 # compose: the gateway's deploy.replicas (infra/haproxy/haproxy.cfg has a server line for each)
worker_health=${STACK_WORKER_HEALTH_PORT:-8080}
prom_port=${STACK_PROMETHEUS_PORT:-9090}
am_port=${STACK_ALERTMANAGER_PORT:-9093}
watch_port=${STACK_WATCH_PORT:-9095}
base_config=${STACK_BASE_CONFIG:-$repo/configs/production.yaml}
pool=lifecycle # compose: prefect worker start --pool lifecycle
host=127.0.0.1
logs=$home/logs
pids=$home/run
config=$home/lifecycle.yaml
sudo_pg=() # the cluster's commands run as the postgres user when we are root (initdb refuses root)
[[ $(id -u) -eq 0 ]] && sudo_pg=(runuser -u postgres --)

die() { echo "stack: $*" >&2; exit 1; }

# --- secrets: infra/.env first, then generated ones --------------------------------------------------------
secrets() {
  local names=(POSTGRES_PASSWORD MLFLOW_DB_PASSWORD PREFECT_DB_PASSWORD SERVING_DB_PASSWORD) name
  set -a
  [[ -f $repo/infra/.env ]] && source "$repo/infra/.env"
  [[ -f $home/secrets.env ]] && source "$home/secrets.env"
  set +a
  for name in "${names[@]}"; do
    if [[ -z ${!name:-} ]]; then
      (umask 077 && echo "$name=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" >>"$home/secrets.env")
      set -a && source "$home/secrets.env" && set +a
    fi
  done
}

# --- each service's command (what `up` runs and `plan` prints) ---------------------------------------------
pg_bin() {
  local found
  found=$(compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" | sort -V | tail -1) ||
    die "no PostgreSQL server binaries: run scripts/install-services.sh"
  dirname "$found"
}

redis_cmd=(redis-server --save "" --appendonly no --bind "$host" --port "$redis_port")
mlflow_cmd=("$venv/bin/mlflow" server "--host=$host" "--port=$mlflow_port" --workers=2
  "--backend-store-uri=postgresql+psycopg://mlflow@$host:$pg_port/mlflow"
  # compose's MinIO bucket: here a folder, proxied by the server the same way (clients never see it)
  "--artifacts-destination=$home/artifacts"
  "--allowed-hosts=mlflow,mlflow:5000,localhost,localhost:*,127.0.0.1,127.0.0.1:*")
prefect_cmd=("$venv/bin/prefect" server start --host "$host" --port "$prefect_port")
worker_cmd() { # N
  echo "$venv/bin/prefect" worker start --pool "$pool" --type process --with-healthcheck --name "worker-$1"
}
schedule_cmd=("$venv/bin/lifecycle" schedule --config "$config" --work-pool "$pool")
# --- gateway replicas behind HAProxy (compose: gateway x2 + gateway-lb; docs/production.md "Gateway replicas")
gateway_cmd() { # N: each replica needs a port of its own here (in compose each container has 3000)
  echo "$venv/bin/lifecycle" serve --config "$config" --port $((replica_port + $1 - 1))
}
lb_cmd=(haproxy -W -db -f "$repo/infra/haproxy/haproxy.cfg")
# --- monitoring (compose: prometheus, alertmanager, champion-watch; docs/operations.md): the files of infra/ with
# the native addresses, written by write_monitoring
prometheus_cmd=(prometheus "--config.file=$home/prometheus/prometheus.yml" "--storage.tsdb.path=$home/prometheus/data"
  "--web.listen-address=$host:$prom_port")
alertmanager_cmd=(prometheus-alertmanager "--config.file=$home/alertmanager/alertmanager.yml"
  "--storage.path=$home/alertmanager/data" "--web.listen-address=$host:$am_port" --cluster.listen-address=)
watch_cmd=("$venv/bin/lifecycle" watch --config "$config")

# environments (names listed by `plan`; values never printed)
mlflow_env() { echo PGPASSWORD="$MLFLOW_DB_PASSWORD" MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false; }
prefect_env() {
  echo PREFECT_SERVER_DATABASE_DRIVER=postgresql+asyncpg PREFECT_SERVER_DATABASE_HOST=$host \
    PREFECT_SERVER_DATABASE_PORT="$pg_port" PREFECT_SERVER_DATABASE_USER=prefect \
    PREFECT_SERVER_DATABASE_NAME=prefect PREFECT_SERVER_DATABASE_PASSWORD="$PREFECT_DB_PASSWORD" \
    PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_API_URL="http://localhost:$prefect_port/api" \
    PREFECT_HOME="$home/prefect-server"
}
worker_env() { # N
  echo PREFECT_API_URL="http://$host:$prefect_port/api" PGPASSWORD="$SERVING_DB_PASSWORD" \
    LIFECYCLE_HOME="$home/home" PREFECT_HOME="$home/prefect-worker-$1" \
    PREFECT_WORKER_WEBSERVER_HOST=$host PREFECT_WORKER_WEBSERVER_PORT=$((worker_health + $1 - 1))
}
schedule_env() { echo PREFECT_API_URL="http://$host:$prefect_port/api" PGPASSWORD="$SERVING_DB_PASSWORD" LIFECYCLE_HOME="$home/home"; }
watch_env() { echo PGPASSWORD="$SERVING_DB_PASSWORD" LIFECYCLE_HOME="$home/home"; }
gateway_env() { echo PGPASSWORD="$SERVING_DB_PASSWORD" LIFECYCLE_HOME="$home/gateway-home"; }
lb_env() { echo LB_BIND=$host:"$gateway_port" GATEWAY_1=$host:"$replica_port" GATEWAY_2=$host:$((replica_port + 1)); }

write_config() {
  cat >"$config" <<EOF
# Written by scripts/stack.sh: $(basename "$base_config") with the native stack's addresses (compose's service
# names mlflow, postgres and redis do not resolve outside its network). No secrets: PGPASSWORD carries them.
extends: $base_config
registry:
  tracking_uri: http://$host:$mlflow_port
serving:
  host: $host
  port: $gateway_port
  database_url: postgresql+psycopg://serving@$host:$pg_port/serving
  api_keys:
    storage_uri: redis://$host:$redis_port/0
monitoring:
  watch:
    host: $host
    port: $watch_port
    alertmanager_url: http://$host:$am_port
EOF
}

# infra/prometheus/prometheus.yml and infra/alertmanager/alertmanager.yml with compose's service names replaced by
# the native addresses (the rule files are read from infra/prometheus itself)
write_monitoring() {
  local i subst=(-e "s|alertmanager:9093|$host:$am_port|" -e "s|localhost:9090|$host:$prom_port|"
    -e "s#^  - \(recording\|alerts\)\.yml#  - $repo/infra/prometheus/\1.yml#")
  for i in $(seq $gateways); do subst+=(-e "s|chat-lifecycle-gateway-$i:3000|$host:$((replica_port + i - 1))|"); done
  mkdir -p "$home/prometheus" "$home/alertmanager"
  sed "${subst[@]}" "$repo/infra/prometheus/prometheus.yml" >"$home/prometheus/prometheus.yml"
  sed "s|http://champion-watch:9095|http://$host:$watch_port|" "$repo/infra/alertmanager/alertmanager.yml" \
    >"$home/alertmanager/alertmanager.yml"
}

# --- processes --------------------------------------------------------------------------------------------
pid_of() { [[ -f $pids/$1.pid ]] && cat "$pids/$1.pid"; }
alive() { local p; p=$(pid_of "$1") && kill -0 -- "-$p" 2>/dev/null; }

# Like compose's `restart: unless-stopped`: the command runs under a shell that starts it again after it exits
# (5 s, doubling to 60 s while it keeps exiting within a minute, as Docker backs off), in a process group of its
# own (the pid file names the group), so `down` stops it and everything it started.
supervise() { # NAME ENV COMMAND...
  local name=$1 env=$2
  shift 2
  alive "$name" && return 0
  mkdir -p "$logs" "$pids"
  # shellcheck disable=SC2016,SC2086 # the inner script is single-quoted on purpose; ENV is a list of NAME=value
  setsid env $env bash -c 'trap "kill -TERM \$child 2>/dev/null; wait \$child; exit 0" TERM
    delay=5
    while :; do
      started=$SECONDS; "$@" & child=$!; wait $child; rc=$?
      ((SECONDS - started >= 60)) && delay=5
      echo "[stack] $(date -Is) exited ($rc), restarting in $delay s"; sleep $delay
      delay=$((delay * 2 > 60 ? 60 : delay * 2))
    done' "$name" "$@" >>"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$pids/$name.pid"
}

healthy() { # NAME
  case $1 in
  postgres) pg_isready -q -h $host -p "$pg_port" ;;
  redis) [[ $(redis-cli -h $host -p "$redis_port" ping 2>/dev/null) == PONG ]] ;;
  mlflow) curl -fs -o /dev/null "http://$host:$mlflow_port/health" ;;
  prefect-server) curl -fs -o /dev/null "http://$host:$prefect_port/api/health" ;;
  worker-*) curl -fs -o /dev/null "http://$host:$((worker_health + ${1#worker-} - 1))/health" ;;
  gateway-lb) curl -fs -o /dev/null "http://$host:$gateway_port/lb-healthz" ;;
  prometheus) curl -fs -o /dev/null "http://$host:$prom_port/-/ready" ;;
  alertmanager) curl -fs -o /dev/null "http://$host:$am_port/-/ready" ;;
  champion-watch) curl -fs -o /dev/null "http://$host:$watch_port/healthz" ;;
  gateway-*) curl -fs -o /dev/null "http://$host:$((replica_port + ${1#gateway-} - 1))/healthz" ;;
  esac
}

wait_healthy() { # NAME TIMEOUT_S
  local deadline=$((SECONDS + $2))
  until healthy "$1"; do
    if [[ $1 != postgres ]] && ! alive "$1"; then
      tail -n 20 "$logs/$1.log" >&2
      die "$1 exited; log: $logs/$1.log"
    fi
    ((SECONDS < deadline)) || die "$1 not healthy after $2 s; log: $logs/$1.log"
    sleep 1
  done
  echo "stack: $1 healthy"
}

postgres_up() {
  local bin data=$home/postgres/data sockets=$home/postgres/sockets
  bin=$(pg_bin)
  if [[ ! -f $data/PG_VERSION ]]; then
    mkdir -p "$home/postgres" "$logs"
    [[ ${#sudo_pg[@]} -gt 0 ]] && chown postgres: "$home/postgres"
    "${sudo_pg[@]}" test -x "$home/postgres" ||
      die "the postgres user cannot reach $home (make its parent folders traversable, or set STACK_HOME)"
    local pw
    pw=$(mktemp) && chmod 644 "$pw" && echo "$POSTGRES_PASSWORD" >"$pw"
    # socket connections trust the cluster's own OS user only (the folder is its alone); TCP needs a password
    "${sudo_pg[@]}" "$bin/initdb" -D "$data" -U postgres --pwfile="$pw" --auth-local=trust \
      --auth-host=scram-sha-256 >"$logs/postgres-init.log" 2>&1 || { rm -f "$pw"; die "initdb failed: $logs/postgres-init.log"; }
    rm -f "$pw"
    "${sudo_pg[@]}" mkdir -m 700 "$sockets"
    local fresh=1
  fi
  if ! "${sudo_pg[@]}" "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
    "${sudo_pg[@]}" "$bin/pg_ctl" start -D "$data" -w -t 60 -l "$home/postgres/server.log" \
      -o "-c listen_addresses=$host -c port=$pg_port -c unix_socket_directories=$sockets" >/dev/null ||
      die "PostgreSQL did not start; log: $home/postgres/server.log"
  fi
  wait_healthy postgres 60
  if [[ -n ${fresh:-} ]]; then # compose runs the same script on an empty volume
    local as_pg=()
    [[ ${#sudo_pg[@]} -gt 0 ]] && as_pg=(runuser --preserve-environment -u postgres --)
    PGHOST=$sockets PGPORT=$pg_port PGUSER=postgres "${as_pg[@]}" bash "$repo/infra/postgres/init-databases.sh" \
      >>"$logs/postgres-init.log" 2>&1 || die "infra/postgres/init-databases.sh failed: $logs/postgres-init.log"
  fi
}

postgres_down() {
  local data=$home/postgres/data
  [[ -f $data/postmaster.pid ]] || return 0
  "${sudo_pg[@]}" "$(pg_bin)/pg_ctl" stop -D "$data" -m fast -w -t 60 >/dev/null && echo "stack: postgres stopped"
}

stop() { # NAME: TERM to its group, KILL what is left after 10 s (compose's default stop grace period)
  local p t0=$SECONDS how=
  p=$(pid_of "$1") || return 0
  if kill -0 -- "-$p" 2>/dev/null; then
    kill -TERM -- "-$p" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 -- "-$p" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$p" 2>/dev/null && how=", killed after 10 s"
    echo "stack: $1 stopped ($((SECONDS - t0)) s$how)"
  fi
  rm -f "$pids/$1.pid"
}

services() {
  echo redis mlflow prefect-server
  for i in $(seq "$workers"); do echo "worker-$i"; done
  for i in $(seq $gateways); do echo "gateway-$i"; done
  echo gateway-lb champion-watch alertmanager prometheus
}

up() {
  [[ -x $venv/bin/lifecycle ]] || die "no $venv: run scripts/setup-env.sh"
  command -v redis-server >/dev/null || die "no redis-server: run scripts/install-services.sh"
  command -v haproxy >/dev/null || die "no haproxy: run scripts/install-services.sh"
  command -v prometheus >/dev/null || die "no prometheus: run scripts/install-services.sh"
  command -v prometheus-alertmanager >/dev/null || die "no prometheus-alertmanager: run scripts/install-services.sh"
  mkdir -p "$home"
  secrets
  write_config
  write_monitoring
  postgres_up
  supervise redis "" "${redis_cmd[@]}"
  supervise mlflow "$(mlflow_env)" "${mlflow_cmd[@]}"
  supervise prefect-server "$(prefect_env)" "${prefect_cmd[@]}"
  wait_healthy redis 30
  # a fresh database is migrated on the first start: minutes on a small machine
  wait_healthy mlflow 300
  wait_healthy prefect-server 300
  local i
  for i in $(seq "$workers"); do
    # shellcheck disable=SC2046 # the worker's command is a list of words
    supervise "worker-$i" "$(worker_env "$i")" $(worker_cmd "$i")
  done
  for i in $(seq "$workers"); do wait_healthy "worker-$i" 120; done
  # compose's one-shot `scheduler`: register the deployments, locks and crash automations on the pool
  # shellcheck disable=SC2046
  env $(schedule_env) "${schedule_cmd[@]}" >>"$logs/scheduler.log" 2>&1 ||
    { tail -n 20 "$logs/scheduler.log" >&2; die "lifecycle schedule --work-pool failed; log: $logs/scheduler.log"; }
  echo "stack: schedules registered on work pool '$pool'"
  # the gateways exit (and are restarted) until the registry has a champion, as in compose
  for i in $(seq $gateways); do
    # shellcheck disable=SC2046
    supervise "gateway-$i" "$(gateway_env)" $(gateway_cmd "$i")
  done
  supervise gateway-lb "$(lb_env)" "${lb_cmd[@]}"
  wait_healthy gateway-lb 30
  supervise champion-watch "$(watch_env)" "${watch_cmd[@]}"
  supervise alertmanager "" "${alertmanager_cmd[@]}"
  supervise prometheus "" "${prometheus_cmd[@]}"
  wait_healthy champion-watch 120
  wait_healthy alertmanager 60
  wait_healthy prometheus 60
  echo "stack: $gateways gateways started behind HAProxy (serve http://$host:$gateway_port once a version is champion; logs: $logs/gateway-N.log)"
  echo "stack: up. MLflow UI http://$host:$mlflow_port, Prefect UI http://$host:$prefect_port, Prometheus http://$host:$prom_port, Alertmanager http://$host:$am_port; clients: eval \"\$(scripts/stack.sh env)\""
}

down() {
  local s
  for s in prometheus alertmanager champion-watch gateway-lb $(for i in $(seq $gateways -1 1); do echo "gateway-$i"; done) \
    $(for i in $(seq 16 -1 1); do echo "worker-$i"; done) prefect-server mlflow redis; do stop "$s"; done
  postgres_down
}

status() {
  local s state
  if pg_isready -q -h $host -p "$pg_port"; then state=healthy; else state=down; fi
  printf '%-15s %-8s %-24s %s\n' postgres "-" "$host:$pg_port" "$state"
  for s in $(services); do
    if alive "$s"; then
      if healthy "$s"; then state=healthy; else state=unhealthy; fi
      printf '%-15s %-8s %-24s %s\n' "$s" "$(pid_of "$s")" "$(address "$s")" "$state"
    else
      printf '%-15s %-8s %-24s %s\n' "$s" "-" "$(address "$s")" stopped
    fi
  done
}

address() {
  case $1 in
  redis) echo "$host:$redis_port" ;;
  mlflow) echo "http://$host:$mlflow_port" ;;
  prefect-server) echo "http://$host:$prefect_port" ;;
  worker-*) echo "pool $pool" ;;
  gateway-lb) echo "http://$host:$gateway_port" ;;
  prometheus) echo "http://$host:$prom_port" ;;
  alertmanager) echo "http://$host:$am_port" ;;
  champion-watch) echo "http://$host:$watch_port" ;;
  gateway-*) echo "http://$host:$((replica_port + ${1#gateway-} - 1))" ;;
  esac
}

env_lines() {
  [[ -d $home ]] || die "no stack in $home: scripts/stack.sh up first"
  secrets
  echo "export PREFECT_API_URL=http://$host:$prefect_port/api"
  echo "export PGPASSWORD=$SERVING_DB_PASSWORD"
  echo "export LIFECYCLE_HOME=$home/home"
  echo "export LIFECYCLE_CONFIG=$config"
}

# TSV: compose service, native process, port, environment (NAME=value,...), command (shell-quoted; '-' for none)
plan() {
  POSTGRES_PASSWORD=x MLFLOW_DB_PASSWORD=x PREFECT_DB_PASSWORD=x SERVING_DB_PASSWORD=x
  # NAME=value, comma-separated; secrets (*PASSWORD*) masked
  names() {
    local kv out=()
    for kv in "$@"; do [[ ${kv%%=*} == *PASSWORD* ]] && out+=("${kv%%=*}=***") || out+=("$kv"); done
    (IFS=,; echo "${out[*]}")
  }
  quoted() { printf '%q ' "$@" | sed 's/ $//'; }
  local i
  # shellcheck disable=SC2046
  {
    # the superuser's password (initdb) and each database role's (infra/postgres/init-databases.sh), as in compose
    printf '%s\t%s\t%s\t%s\t%s\n' postgres postgres "$pg_port" \
      "$(names POSTGRES_PASSWORD=x MLFLOW_DB_PASSWORD=x PREFECT_DB_PASSWORD=x SERVING_DB_PASSWORD=x)" \
      "$(quoted "$( (pg_bin 2>/dev/null) || echo /usr/lib/postgresql/MAJOR/bin)/postgres") init=infra/postgres/init-databases.sh"
    printf '%s\t%s\t%s\t%s\t%s\n' minio - - - "- artifacts-destination=$home/artifacts"
    printf '%s\t%s\t%s\t%s\t%s\n' minio-init - - - "- artifacts-destination=$home/artifacts"
    printf '%s\t%s\t%s\t%s\t%s\n' redis redis "$redis_port" - "$(quoted "${redis_cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\n' mlflow mlflow "$mlflow_port" "$(names $(mlflow_env))" "$(quoted "${mlflow_cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\n' prefect-server prefect-server "$prefect_port" "$(names $(prefect_env))" "$(quoted "${prefect_cmd[@]}")"
    for i in $(seq "$workers"); do
      printf '%s\t%s\t%s\t%s\t%s\n' prefect-worker "worker-$i" "$((worker_health + i - 1))" "$(names $(worker_env "$i"))" "$(quoted $(worker_cmd "$i"))"
    done
    printf '%s\t%s\t%s\t%s\t%s\n' scheduler scheduler - "$(names $(schedule_env))" "$(quoted "${schedule_cmd[@]}")"
    for i in $(seq $gateways); do
      printf '%s\t%s\t%s\t%s\t%s\n' gateway "gateway-$i" "$((replica_port + i - 1))" "$(names $(gateway_env))" "$(quoted $(gateway_cmd "$i"))"
    done
    printf '%s\t%s\t%s\t%s\t%s\n' gateway-lb gateway-lb "$gateway_port" "$(names $(lb_env))" "$(quoted "${lb_cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\n' prometheus prometheus "$prom_port" - "$(quoted "${prometheus_cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\n' alertmanager alertmanager "$am_port" - "$(quoted "${alertmanager_cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\n' champion-watch champion-watch "$watch_port" "$(names $(watch_env))" "$(quoted "${watch_cmd[@]}")"
    printf '%s\t%s\t%s\t%s\t%s\n' trainer - - "$(names $(schedule_env))" "- lifecycle (scripts/stack.sh env)"
  }
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
env) env_lines ;;
plan) plan ;;
monitoring) write_monitoring && cat "$home/prometheus/prometheus.yml" "$home/alertmanager/alertmanager.yml" ;;
config) config=/dev/stdout write_config ;;
*) die "usage: scripts/stack.sh up|down|status|env|plan|config|monitoring (see the header of $0)" ;;
esac
