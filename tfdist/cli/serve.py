"""`tfdist serve [CONFIG] [--task TYPE:INDEX]`: run a worker or ps server of a
parameter-server cluster until stopped."""

from __future__ import annotations

from tfdist.config import load_config
from tfdist.strategy.server import serve

USAGE = "tfdist serve [CONFIG] [--task TYPE:INDEX]"


def run(args: list[str], task: str | None) -> int:
  if len(args) > 1:
    raise SystemExit(f"usage: {USAGE}")
  config = load_config(args[0] if args else None, task=task)
  print(f"tfdist serve: {config.task} of {config.source or 'TF_CONFIG'}", flush=True)
  serve(config)
  return 0
