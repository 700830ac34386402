#!/usr/bin/env bash
# The registered champion of a task as a REST endpoint, a plain foreground process on 127.0.0.1 (Ctrl-C stops it).
# POST /invocations, GET /ping; README "Use the model" shows a request.
#
#   bash scripts/serve_model.sh                       # (make serve-model) the champion of $TTT_SERVE_MODEL, followed:
#                                                     # `ttt-pipeline serve` switches to a new champion when the alias
#                                                     # moves (no restart, no failed request)
#   bash scripts/serve_model.sh models:/NAME/3        # one fixed model: any URI MLflow takes, or a model folder
#                                                     # (`mlflow models serve`)
#
# Settings (environment): TTT_SERVE_MODEL (registered model name, default the demo's
# ttt-demo-reviews-negative-positive; `ttt-pipeline` names one per task: ttt-<task>-<labels>), TTT_SERVE_PORT
# (5001), TTT_HOST (127.0.0.1), TTT_TRACKING_URI, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db of this
# checkout (a server started by `make servers`: `source .run/env` first), TTT_BIN (the virtualenv's bin folder).
# MLflow starts the scoring server as `uvicorn` from PATH, so the virtualenv's bin folder leads PATH here:
# from a plain shell, `.venv/bin/mlflow models serve` alone fails with "exec: uvicorn: not found".
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TTT_BIN:-$REPO/.venv/bin}"
NAME="${TTT_SERVE_MODEL:-ttt-demo-reviews-negative-positive}"
MODEL="${1:-models:/$NAME@champion}"
HOST="${TTT_HOST:-127.0.0.1}"
PORT="${TTT_SERVE_PORT:-5001}"
export MLFLOW_TRACKING_URI="${TTT_TRACKING_URI:-${MLFLOW_TRACKING_URI:-sqlite:///$REPO/mlflow.db}}"
export PATH="$BIN:$PATH"
export TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1 MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false

die() { echo "serve-model: error: $1" >&2; echo "hint: $2" >&2; exit 2; }
[[ -x "$BIN/mlflow" && -x "$BIN/uvicorn" && -x "$BIN/ttt-pipeline" ]] \
  || die "no mlflow, uvicorn or ttt-pipeline in $BIN" "make setup (or set TTT_BIN)"
case "$MLFLOW_TRACKING_URI" in
  sqlite:///*)  # a missing file would be created empty and then "not found": say what is missing instead
    db="${MLFLOW_TRACKING_URI#sqlite:///}"
    [[ "$MODEL" != models:/* || -f "$db" || -f "/$db" ]] \
      || die "no MLflow database at $db" "run the pipeline first (make run), or set TTT_TRACKING_URI" ;;
esac

echo "serve-model: $MODEL from $MLFLOW_TRACKING_URI on http://$HOST:$PORT (POST /invocations, GET /ping)"
if [[ $# -eq 0 ]]; then  # the champion: followed
  exec "$BIN/ttt-pipeline" serve --model "$NAME" --host "$HOST" --port "$PORT"
fi
exec "$BIN/mlflow" models serve -m "$MODEL" --env-manager local --host "$HOST" --port "$PORT"
