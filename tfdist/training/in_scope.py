"""Models whose weights a strategy does not hold, found before they train.

tf.distribute mirrors (or places) only the variables created in its scope; a model built
outside it trains each replica's own copy, or fails deep inside TensorFlow ("`colocate_vars_with`
must only be passed a variable created in this tf.distribute.Strategy.scope()", with every
weight printed). Checked here, where a model is handed over, in one line.

```python
in_scope.require_built_in_scope(strategy, [model], "loop.prepare",
                                "build it inside `with loop.scope():`")
```
"""

from __future__ import annotations

from tfdist.errors import ModelError


def require_built_in_scope(strategy, models, where: str, fix: str) -> None:
  """Raises `ModelError` naming the first model with a weight `strategy` did not create.

  Args:
    strategy: the run's strategy.
    models: Keras models.
    where: what received them ("loop.prepare", "tfdist.fit's model_fn").
    fix: what to do, in a clause.
  """
  for model in models:  # The default strategy holds every variable.
    outside = [v.path for v in model.weights
               if not strategy.extended.variable_created_in_scope(getattr(v, "value", v))]
    if outside:
      raise ModelError(f"{where}: model {model.name!r} was built outside the strategy's scope, "
                       f"so {strategy.__class__.__name__} does not hold its weights "
                       f"({len(outside)} of them, first {outside[0]!r}): {fix}")
