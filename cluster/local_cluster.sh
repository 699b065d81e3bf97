#!/usr/bin/env bash
# A multi-node Ray cluster on one machine, for trying placement of template shards.
#
#   cluster/local_cluster.sh start [WORKERS]   # head + WORKERS worker nodes (default 2)
#   cluster/local_cluster.sh status
#   cluster/local_cluster.sh stop
#
# Each node is a separate raylet with a custom resource "node<i>" and a few
# "gpu_standin" units, so placement across nodes can be seen (and requested)
# without GPUs. Python code connects with ray.init(address="127.0.0.1:6380").
set -euo pipefail
cd "$(dirname "$0")/.."
RAY=${RAY:-.venv/bin/ray}
PORT=${HETMM_RAY_PORT:-6380}
CPUS_PER_NODE=${CPUS_PER_NODE:-1}
# Ray 2.60 authenticates every node with a token (~/.ray/auth_token); make one if missing.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}

case "${1:-}" in
  start)
    workers=${2:-2}
    [ -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ] || "$RAY" get-auth-token --generate >/dev/null
    "$RAY" start --head --node-ip-address=127.0.0.1 --port="$PORT" --num-cpus="$CPUS_PER_NODE" \
      --resources='{"node0": 1, "gpu_standin": 4}' --include-dashboard=false --disable-usage-stats
    for i in $(seq 1 "$workers"); do
      "$RAY" start --address="127.0.0.1:$PORT" --node-ip-address=127.0.0.1 --num-cpus="$CPUS_PER_NODE" \
        --resources="{\"node$i\": 1, \"gpu_standin\": 4}" --disable-usage-stats
    done
    echo "connect with: ray.init(address=\"127.0.0.1:$PORT\")"
    ;;
  status) "$RAY" status --address="127.0.0.1:$PORT" ;;
  stop) "$RAY" stop ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
