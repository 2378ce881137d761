"""Exit codes that mean the same to every room: a task's to its launcher, the launcher's to
Slurm and Kubernetes. Below both `training` (which exits with them) and `launch` (which reads
them)."""

PREEMPTED = 42
"""A task saved its backup after a preemption notice and exited: "restart me". The launcher
restarts the cluster (or exits with it), the sbatch script requeues the job, Kubernetes'
failure policies restart the pods. TensorFlow's `TerminationConfig` exits with the same code."""
