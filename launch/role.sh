#!/usr/bin/env bash
# Runs one task of a real cluster on this host: run it on every host with that host's task.
#   launch/role.sh CONFIG TYPE:INDEX COMMAND...   e.g. launch/role.sh launch/cluster-template.yaml worker:1 python train.py
# In a parameter-server cluster, the worker and ps tasks run `tfdist cluster-server` whatever COMMAND is.
set -euo pipefail
config="$1"; task="$2"; shift 2
exec tfdist launch "$config" --task "$task" -- "$@"
