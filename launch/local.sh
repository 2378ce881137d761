#!/usr/bin/env bash
# Runs every task of a cluster given by counts on this machine (127.0.0.1, free ports).
#   launch/local.sh CONFIG COMMAND...      e.g. launch/local.sh configs/multi_worker_mirrored.yaml python -m tfdist.examples.digits
# Restarts the cluster once after a failure; training resumes from its backup.
set -euo pipefail
config="$1"; shift
exec tfdist launch "$config" --max-restarts "${TFDIST_MAX_RESTARTS:-1}" -- "$@"
