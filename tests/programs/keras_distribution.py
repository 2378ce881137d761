"""A script written for Keras's own distribution API, as its guide writes one, plus tfdist's
switch: `keras.distribution.DataParallel`, then Keras's own `fit`, `evaluate` and `predict` of
the equivalence model. Prints `RESULT <json>` (history, evaluation, predictions, weights) and
`COPIES <n>`, the copies of the first kernel. Run in a task `tfdist launch` started (or
`run_everywhere` with TFDIST_PREPARE=1): importing tfdist makes the task's strategy first."""

import json

import numpy as np

import tfdist
from tests.programs import equivalence_case as case


def main():
  import keras

  devices = keras.distribution.list_devices()
  mesh = keras.distribution.DeviceMesh((len(devices),), ["batch"], devices)
  keras.distribution.set_distribution(keras.distribution.DataParallel(device_mesh=mesh))
  tfdist.use_keras_distribution()  # The switch: the rest is Keras's own.
  model = case.model_fn()
  model.compile(**case.compile_args(), steps_per_execution=1)
  x, y = case.data()
  history = case.fit_plain(model, x, y, case.EPOCHS)
  result = {"history": history,
            "evaluate": [float(v) for v in model.evaluate(x, y, batch_size=case.GLOBAL_BATCH,
                                                          verbose=0)],
            "predict": np.asarray(model.predict(x[:40], batch_size=case.GLOBAL_BATCH,
                                                verbose=0)).tolist(),
            "predict_dtype": "float32", "compute_dtype": "float32",
            "weights": [w.tolist() for w in model.get_weights()]}
  print("COPIES", len(getattr(model.layers[0].kernel.value, "values", [None])), flush=True)
  print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
