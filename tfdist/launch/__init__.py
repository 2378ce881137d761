"""`tfdist launch`, as a library: a cluster's backend (backends/), its processes planned as data
(plan.py), then started and supervised in one loop (supervisor.py): the detectors (detectors.py)
and the membership (membership.py: alone, or a per-host elastic launch's rendezvous) report
events, decisions.py picks each action, processes.py starts and stops the tasks, narration.py
says what happened; in one call.

Takes: a config file, the user's command and `LaunchOptions`. Gives: `launch` an `Outcome`
(the exit code of `tfdist.exit_codes`, the root cause's line, every task failure), every task's
output prefixed and logged; `dry_run` the `LaunchPlan` it would start.
A backend (`backends/`: local, slurm, ray) gives `discover(config, options, environ) ->
Discovery`, `start(ProcessPlan) -> Popen` (or Popen's surface) and `finish(outcome, environ)`:
its contract is `backends/__init__.py`'s. Never imports: TensorFlow (the launcher starts
processes that import it), `training` or `cli`; tasks talk back through heartbeat files
(`liveness.py`).

```python
from tfdist.launch import LaunchOptions, launch
outcome = launch("configs/multi_worker_mirrored.yaml", ["python", "train.py"],
                 LaunchOptions(max_restarts=1))
```
"""

from tfdist.launch.launcher import LaunchOptions, dry_run, launch

__all__ = ["LaunchOptions", "dry_run", "launch"]
