"""`tfdist.fit`'s progress for the launcher's hang deadline (`tfdist.progress`): each call of
the compiled steps begun and finished; the epoch's end (evaluation, checkpoints, the user's
`on_epoch_end`) idle."""

from __future__ import annotations

import keras

import tfdist.progress as progress


class ProgressCallback(keras.callbacks.Callback):
  """Records Keras's calls (batch callbacks come once per call); first among the callbacks, so
  an epoch's end is idle before any other callback's work starts.

  Args:
    first_epoch: the epoch training starts at (a resumed run's).
  """

  def __init__(self, first_epoch: int = 0):
    super().__init__()
    self._epoch = first_epoch

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch
    progress.between(epoch)

  def on_train_batch_begin(self, batch, logs=None):
    progress.begin_call(self._epoch, batch)

  def on_train_batch_end(self, batch, logs=None):
    progress.finish_call(batch + 1)  # Keras passes the call's last step.

  def on_test_begin(self, logs=None):
    progress.idle()  # Evaluation: every task evaluates, none waits on a training call.

  def on_epoch_end(self, epoch, logs=None):
    progress.idle()

  def on_train_end(self, logs=None):
    progress.idle()
