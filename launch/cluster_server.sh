#!/usr/bin/env bash
# Runs one worker or ps server of a parameter-server cluster on this host.
#   launch/cluster_server.sh CONFIG TYPE:INDEX
#   e.g. launch/cluster_server.sh configs/parameter_server.yaml ps:0
# TF_CONFIG, when set, gives the addresses (and the task, unless TYPE:INDEX is given).
set -euo pipefail
config="$1"; shift
exec tfdist cluster-server "$config" ${1:+--task "$1"}
