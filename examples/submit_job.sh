#!/usr/bin/env bash
# Submit an nshot training to a Ray cluster through the Jobs API (what `ray job submit` does).
#
#   clusters/local/start.sh --workers 1               # or any cluster: see README "Run on a cluster"
#   examples/submit_job.sh                            # nshot train tail --preset small --workers 2
#   examples/submit_job.sh tail --preset smoke --workers 2 --set steps=20
#
# Without RAY_ADDRESS it targets the local cluster of clusters/local/start.sh (address and token
# from `python -m nshot.cluster env`). For another cluster set RAY_ADDRESS=http://HEAD:8265,
# RAY_AUTH_MODE=token and the token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RAY_ADDRESS:-}" ]; then
  eval "$("${PYTHON:-python}" -m nshot.cluster env)"
fi
method="${1:-tail}"
[ $# -gt 0 ] && shift
if [ $# -eq 0 ]; then
  set -- --preset small --workers 2
fi
exec ray job submit --working-dir . --runtime-env examples/runtime_env.yaml -- \
  nshot train "$method" "$@"
