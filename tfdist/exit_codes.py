"""Exit codes that mean the same to every room: a task's to its launcher, the launcher's to
Slurm and Kubernetes, the CLI's to a shell. Below `training` (which exits with them), `launch`
(which reads them) and `cli`; the docs' exit-code reference is generated from this module.

Each code is a constant with its meaning as its docstring; `SIGNALLED` is a base, not a code.
"""

OK = 0
"""Every task ended with 0 (the launch), or the command did what it was asked."""

TASK_FAILED = 1
"""A task failed, hung or was lost: the launcher names the root cause and shows its log's tail
(`tfdist launch`; after `--max-restarts` restarts, if any)."""

USAGE = 2
"""Bad input, refused before anything started: a config, a flag, a dataset, a model function.
One line names the file, the key or flag, the rule and what was received. A launched task
refused by tfdist (a `TfdistError`) exits with it too."""

STARTUP_TIMEOUT = 3
"""`tfdist launch`: a task of the cluster (this host's or a peer's) did not accept connections
within `--startup-timeout`; the line names the missing ones."""

PREEMPTED = 42
"""A task saved its backup after a preemption notice and exited: "restart me". The launcher
restarts the cluster (or exits with it), the sbatch script requeues the job, Kubernetes'
failure policies restart the pods. TensorFlow's `TerminationConfig` exits with the same code."""

SIGNALLED = 128
"""`tfdist launch` stopped by a signal before every task saved: 128 + the signal's number
(130 for SIGINT, 143 for SIGTERM), as shells report."""
