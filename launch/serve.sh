#!/usr/bin/env bash
# The old name of launch/cluster_server.sh, kept for this release (0.1).
echo "launch/serve.sh is now launch/cluster_server.sh; the old name goes in the next release" >&2
exec "$(dirname "$0")/cluster_server.sh" "$@"
