"""Keras training under a strategy: `tfdist.fit`, `tfdist.TrainingLoop` and the
parameter-server loop, the settings every path honours or refuses (`settings.py`, one home),
data distribution, Keras 3 workarounds (`keras_fixes.py`), preemption, checkpoints,
optimizer-state sharding, `keras.distribution` on TensorFlow.

Takes: a `Config` (or the launched task's) and the user's model function, data and callbacks.
Gives: a trained model with one device's results under the synchronous strategies, a Keras
`History`, exit 42 after a preemption save. Never imports: `launch` or `cli`; it talks to the
launcher only through files and environment variables (`launch.liveness`'s heartbeat).
"""
