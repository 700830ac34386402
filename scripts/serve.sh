#!/usr/bin/env bash
# Local services for the pipeline, as background processes on 127.0.0.1 (no Docker needed):
#   Prefect server, one process worker on each work pool (`cpu`, `gpu`; pools created when missing) and an
#   MLflow tracking server (sqlite backend, artifacts proxied under mlruns/).
#
#   bash scripts/serve.sh start     # (make servers) start everything, wait until healthy, print how to use it
#   bash scripts/serve.sh stop      # (make stop)  stop everything it started, check no port is left listening
#   bash scripts/serve.sh status
#
# Pid files and logs live in $TTT_RUN_DIR (default .run/, gitignored); `source .run/env` points a shell at the
# services. Every setting below can be overridden from the environment (the integration test does so).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="${TTT_RUN_DIR:-$REPO/.run}"
HOST="${TTT_HOST:-127.0.0.1}"
PREFECT_PORT="${TTT_PREFECT_PORT:-4200}"
MLFLOW_PORT="${TTT_MLFLOW_PORT:-5000}"
BIN="${TTT_BIN:-$REPO/.venv/bin}"
# Prefect's own default home, as `make run` uses it: the server shows the runs `make run` recorded there
export PREFECT_HOME="${PREFECT_HOME:-$HOME/.prefect}"
export TTT_PIPELINE_HOME="${TTT_PIPELINE_HOME:-$REPO}"
MLFLOW_BACKEND="${TTT_MLFLOW_BACKEND:-sqlite:///$REPO/mlflow.db}"
MLFLOW_ARTIFACTS="${TTT_MLFLOW_ARTIFACTS:-$REPO/mlruns}"
GPU_LIMIT="${TTT_GPU_WORKER_LIMIT:-1}"        # one heavy job at a time per GPU worker
WAIT_S="${TTT_SERVE_WAIT_S:-180}"
SERVICES=(prefect-server worker-cpu worker-gpu mlflow)

export PREFECT_API_URL="http://$HOST:$PREFECT_PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 PREFECT_CLI_PROMPT=false
export TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1 MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false
if [[ -n "${PREFECT_API_AUTH_STRING:-}" ]]; then      # basic auth on the API: server and clients share it
  export PREFECT_SERVER_API_AUTH_STRING="$PREFECT_API_AUTH_STRING"
fi

log() { echo "serve: $*"; }
die() { echo "serve: error: $*" >&2; exit 1; }
pidfile() { echo "$RUN_DIR/$1.pid"; }
alive() { local f; f="$(pidfile "$1")"; [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }
listening() { ss -ltnH "sport = :$1" 2>/dev/null | grep -q .; }

curl_api() {  # curl_api PATH [curl args...]: the Prefect API, with the auth string when one is set
  local path="$1"; shift
  if [[ -n "${PREFECT_API_AUTH_STRING:-}" ]]; then
    curl -fsS --max-time 5 -u "$PREFECT_API_AUTH_STRING" "$PREFECT_API_URL$path" "$@"
  else
    curl -fsS --max-time 5 "$PREFECT_API_URL$path" "$@"
  fi
}

launch() {  # launch NAME COMMAND...: own session (process group = pid), so stop can end its children too
  local name="$1"; shift
  setsid "$@" >"$RUN_DIR/$name.log" 2>&1 < /dev/null &
  echo $! >"$(pidfile "$name")"
  log "started $name (pid $!, log $RUN_DIR/$name.log)"
}

wait_for() {  # wait_for WHAT SERVICE COMMAND...: poll until COMMAND succeeds, the service dies or time runs out
  local what="$1" svc="$2"; shift 2
  local deadline=$((SECONDS + WAIT_S))
  until "$@" >/dev/null 2>&1; do
    alive "$svc" || { tail -n 30 "$RUN_DIR/$svc.log" >&2; die "$svc exited while waiting for $what"; }
    (( SECONDS < deadline )) || { tail -n 30 "$RUN_DIR/$svc.log" >&2; die "timed out waiting for $what"; }
    sleep 1
  done
  log "$what: ok"
}

worker_online() {  # a worker of pool $1 has sent a heartbeat
  curl_api "/work_pools/$1/workers/filter" -X POST -H 'Content-Type: application/json' -d '{}' \
    | grep -q '"status":"ONLINE"'
}

start() {
  mkdir -p "$RUN_DIR" "$PREFECT_HOME" "$MLFLOW_ARTIFACTS"
  for s in "${SERVICES[@]}"; do
    alive "$s" && die "$s is already running (pid $(cat "$(pidfile "$s")")); run: bash scripts/serve.sh stop"
  done
  for p in "$PREFECT_PORT" "$MLFLOW_PORT"; do
    listening "$p" && die "port $p is already in use (set TTT_PREFECT_PORT / TTT_MLFLOW_PORT)"
  done
  echo "$PREFECT_PORT $MLFLOW_PORT" >"$RUN_DIR/ports"

  launch prefect-server "$BIN/prefect" server start --host "$HOST" --port "$PREFECT_PORT"
  launch mlflow "$BIN/mlflow" server --backend-store-uri "$MLFLOW_BACKEND" \
    --artifacts-destination "$MLFLOW_ARTIFACTS" --host "$HOST" --port "$MLFLOW_PORT" --workers 1 \
    --allowed-hosts "$HOST:$MLFLOW_PORT,localhost:$MLFLOW_PORT,$HOST,localhost"
  wait_for "Prefect API $PREFECT_API_URL" prefect-server curl_api /health

  for pool in cpu gpu; do
    if ! "$BIN/prefect" work-pool inspect "$pool" >/dev/null 2>&1; then
      "$BIN/prefect" work-pool create "$pool" --type process >/dev/null
      log "created work pool $pool (process)"
    fi
  done
  launch worker-cpu "$BIN/prefect" worker start --pool cpu --type process --name "cpu-$(hostname)"
  launch worker-gpu "$BIN/prefect" worker start --pool gpu --type process --name "gpu-$(hostname)" \
    --limit "$GPU_LIMIT"
  wait_for "MLflow http://$HOST:$MLFLOW_PORT" mlflow curl -fsS --max-time 5 "http://$HOST:$MLFLOW_PORT/health"
  wait_for "worker on pool cpu" worker-cpu worker_online cpu
  wait_for "worker on pool gpu" worker-gpu worker_online gpu

  cat >"$RUN_DIR/env" <<EOF
export PREFECT_API_URL=$PREFECT_API_URL
export PREFECT_HOME=$PREFECT_HOME
export TTT_PIPELINE_HOME=$TTT_PIPELINE_HOME
export MLFLOW_TRACKING_URI=http://$HOST:$MLFLOW_PORT
EOF
  log "ready: Prefect UI http://$HOST:$PREFECT_PORT  MLflow UI http://$HOST:$MLFLOW_PORT"
  log "next: source $RUN_DIR/env && $BIN/prefect --no-prompt deploy --all"
}

stop() {
  local any=0
  for s in worker-cpu worker-gpu mlflow prefect-server; do
    local f; f="$(pidfile "$s")"
    [[ -f "$f" ]] || continue
    any=1
    local pid; pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then
      # Ctrl-C twice (a Prefect worker shuts down on the first and kills its runs on the second), then
      # SIGTERM, then SIGKILL for whatever is left of the process group (uvicorn children, flow runs).
      local sig
      for sig in INT INT TERM; do
        kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
        for _ in $(seq 1 10); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null || break
      done
      kill -0 "$pid" 2>/dev/null && log "$s (pid $pid) ignored SIGINT and SIGTERM; killing its process group"
      kill -KILL -- "-$pid" 2>/dev/null || true
      log "stopped $s (pid $pid)"
    fi
    rm -f "$f"
  done
  (( any )) || log "nothing was running"
  if [[ -f "$RUN_DIR/ports" ]]; then
    local left=()
    for p in $(cat "$RUN_DIR/ports"); do
      for _ in $(seq 1 20); do listening "$p" || break; sleep 0.5; done
      listening "$p" && left+=("$p")
    done
    (( ${#left[@]} == 0 )) || die "still listening on port(s) ${left[*]}"
    rm -f "$RUN_DIR/ports"
    log "no port left listening"
  fi
}

status() {
  for s in "${SERVICES[@]}"; do
    if alive "$s"; then echo "$s: running (pid $(cat "$(pidfile "$s")"))"; else echo "$s: stopped"; fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  restart) stop; start ;;
  *) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
