"""Every command-line flag of the `tfdist` CLI, defined in one place. Multi-word flags are
spelled with hyphens (`--dry-run`), as torchrun and accelerate spell theirs; read them as
`FLAGS["dry-run"].value`."""

from absl import flags


def define_flags() -> None:
  """Defines the CLI's flags; call once, before parsing."""
  flags.DEFINE_string(
      "task", None, "The task this process runs, as TYPE:INDEX (e.g. worker:1). Overrides the "
      "config file's task and TF_CONFIG's.")
  flags.DEFINE_bool("dry-run", False, "launch: print the plan of processes; start nothing.")
  flags.DEFINE_integer("max-restarts", 0, "launch: restarts allowed after a failure (of the "
                       "whole synchronous cluster, or of a failed parameter-server worker).",
                       lower_bound=0)
  flags.DEFINE_float("startup-timeout", 120, "launch: seconds for every task's server to come "
                     "up before the launch fails naming the missing tasks.", lower_bound=1)
  flags.DEFINE_float("grace-period", 5, "launch: seconds between SIGTERM and SIGKILL when "
                     "stopping tasks.", lower_bound=0)
  flags.DEFINE_string("logs", None, "launch: directory of the per-task logs; default "
                      "tfdist-logs/<date-time>.")
