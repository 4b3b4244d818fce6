#!/usr/bin/env bash
# Start a local multi-node Ray cluster on this machine: a head and N worker nodes on 127.0.0.1,
# each a separate `ray start --block` process with its own CPUs and a custom resource
# (node_head, node_w1, ...). Token authentication on; the dashboard and Jobs API on
# 127.0.0.1:8275. All ports are explicit (see --help), so it runs beside another Ray.
#
#   clusters/local/start.sh                          # head (1 CPU) + 1 worker node (1 CPU)
#   clusters/local/start.sh --workers 2 --head-cpus 2 --worker-cpus 2
#   eval "$(python -m nshot.cluster env)"            # RAY_ADDRESS, RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH
#   ray job submit --working-dir . -- nshot train tail --preset small --workers 2
#   clusters/local/stop.sh
#
# State (PIDs, ports, dashboard URL, token): $NSHOT_CLUSTER_DIR (default ~/.cache/nshot/local-cluster).
set -euo pipefail
exec "${PYTHON:-python}" -m nshot.cluster start "$@"
