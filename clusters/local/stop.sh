#!/usr/bin/env bash
# Stop the local cluster that clusters/local/start.sh started: exactly its processes (the
# recorded process groups and their children), never another Ray on the machine (no `ray stop`).
#   clusters/local/stop.sh            # keeps Ray's logs (/tmp/nshot-ray-<port>) and the token
#   clusters/local/stop.sh --purge    # deletes them too
set -euo pipefail
exec "${PYTHON:-python}" -m nshot.cluster stop "$@"
