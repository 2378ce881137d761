"""Every command-line flag of the `tfdist` CLI, defined in one place."""

from absl import flags


def define_flags() -> None:
  """Defines the CLI's flags; call once, before parsing."""
  flags.DEFINE_string(
      "task", None, "The task this process runs, as TYPE:INDEX (e.g. worker:1). Overrides the "
      "config file's task and TF_CONFIG's.")
