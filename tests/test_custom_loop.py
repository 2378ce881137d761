"""A user's own training loop (tfdist.TrainingLoop) and a subclass's own train_step (tfdist.fit)
under every strategy, written as for one device: one device's weights, losses and metrics under
one_device, mirrored and central_storage (2 logical CPUs) and multi_worker_mirrored (2
processes); parameter_server converges; a cluster restarted after a killed worker resumes to an
uninterrupted run's weights; the docs' loop runs as written."""

import re
import sys

import numpy as np
import pytest

from tests.conftest import PROGRAMS, REPO
from tests.launching import finish, start_launch
from tests.programs import custom_loop, custom_train_step

pytestmark = pytest.mark.usefixtures("two_cpus")
TRAINING = {"global_batch_size": 32, "mixed_precision": "off", "steps_per_execution": 3}
STRATEGIES = {
    "one_device": {"strategy": "one_device"},
    "mirrored": {"strategy": "mirrored", "devices": {"logical_cpus": 2}},
    "central_storage": {"strategy": "central_storage", "devices": {"logical_cpus": 2}},
}


@pytest.fixture(scope="module")
def one_device_loop():
  """The hand-written one-device loop's (weights, losses, accuracies), no tfdist."""
  return {style: custom_loop.train_by_hand(style, TRAINING["steps_per_execution"])
          for style in ("keras_loss", "reduce_mean")}


def assert_same(got, want, atol=1e-5):
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, atol=atol)


@pytest.mark.parametrize("style", ["keras_loss", "reduce_mean"])
@pytest.mark.parametrize("strategy", ["default", *STRATEGIES])
def test_the_loop_gives_one_devices_weights_losses_and_metrics(one_device_loop, strategy, style):
  weights, losses, accuracies = custom_loop.train(
      {**STRATEGIES.get(strategy, {"strategy": strategy}), "training": TRAINING}, style)
  want_weights, want_losses, want_accuracies = one_device_loop[style]
  assert_same(weights, want_weights)
  np.testing.assert_allclose(losses, want_losses, atol=1e-5)
  np.testing.assert_allclose(accuracies, want_accuracies, atol=1e-6)  # central_storage: #21054.
  assert losses[-1] < losses[0]


def test_the_configs_accumulation_and_precision_apply_to_the_loop():
  accumulating = {**TRAINING, "gradient_accumulation_steps": 2}
  want, _, _ = custom_loop.train_by_hand(steps_per_execution=3, accumulate=2)
  got, _, _ = custom_loop.train({**STRATEGIES["mirrored"], "training": accumulating})
  assert_same(got, want)
  plain, _, _ = custom_loop.train_by_hand(steps_per_execution=3)
  assert max(float(np.abs(a - b).max()) for a, b in zip(want, plain)) > 1e-3  # It acted.
  import keras
  import tfdist
  loop = tfdist.TrainingLoop({"strategy": "default",
                              "training": {**TRAINING, "mixed_precision": "bfloat16"}})
  with loop.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)])
  loop.prepare(model)
  assert [layer.dtype_policy.name for layer in model.layers] == ["mixed_bfloat16", "float32"]
  assert keras.config.dtype_policy().name == "float32"  # Restored after the scope.


@pytest.mark.parametrize("style", ["reduce_mean", "compute_loss"])
@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_a_subclass_train_step_under_fit_trains_as_one_device(strategy, style):
  training = {"global_batch_size": 32, "mixed_precision": "off"}
  want_weights, want_losses = custom_train_step.train_plain(style)
  weights, losses = custom_train_step.train({**STRATEGIES[strategy], "training": training},
                                            style)
  assert_same(weights, want_weights)
  np.testing.assert_allclose(losses, want_losses, atol=1e-5)  # Not halved.


def launch(tmp_path, config, program, *args, extra=(), env=None):
  (tmp_path / "config.yaml").write_text(config)
  process = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"), *extra,
                         "--", sys.executable, str(PROGRAMS / program), str(tmp_path / "out"),
                         *args, env=env)
  output = finish(process, 240, [])
  assert process.returncode == 0, output[-3000:]
  return output, np.load(tmp_path / "out" / "result.npz")


MWMS = ("cluster: {worker: 2}\ntraining: {global_batch_size: 32, mixed_precision: 'off', "
        "steps_per_execution: 3}\n")


def test_the_loop_on_two_workers_gives_one_devices_weights(tmp_path, one_device_loop):
  output, result = launch(tmp_path, MWMS, "custom_loop.py", "reduce_mean")
  want_weights, want_losses, want_accuracies = one_device_loop["reduce_mean"]
  assert_same([result[f"w{i}"] for i in range(4)], want_weights)
  np.testing.assert_allclose(result["losses"], want_losses, atol=1e-5)
  np.testing.assert_allclose(result["accuracies"], want_accuracies, atol=1e-6)
  assert len(re.findall(r"^\[worker-0\] epoch \d: loss", output, re.M)) == custom_loop.EPOCHS


def test_a_train_step_on_two_workers_trains_as_one_device(tmp_path):
  want_weights, want_losses = custom_train_step.train_plain("reduce_mean")
  _, result = launch(tmp_path, "cluster: {worker: 2}\ntraining: {global_batch_size: 32, "
                     "mixed_precision: 'off'}\n", "custom_train_step.py", "reduce_mean")
  assert_same([result[f"w{i}"] for i in range(4)], want_weights)
  np.testing.assert_allclose(result["losses"], want_losses, atol=1e-5)


def test_the_loop_under_parameter_server_converges(tmp_path):
  """8 steps an epoch (`steps=`) in calls of 3: 3, 3 and 2 steps, 32 over 4 epochs, as every
  strategy counts them."""
  _, result = launch(tmp_path, "cluster: {chief: 1, worker: 2, ps: 1}\n"
                     "strategy: parameter_server\ntraining: {global_batch_size: 32, "
                     "mixed_precision: 'off', steps_per_execution: 3}\n", "custom_loop.py")
  assert int(result["steps"]) == int(result["iterations"]) == 32
  assert result["losses"][-1] < 0.8 * result["losses"][0]
  # Asynchronous workers apply stale gradients: the last epoch's accuracy measured 0.73-0.90
  # over runs; chance is 0.5.
  assert result["accuracies"][-1] > 0.65


@pytest.mark.parametrize("killed", ["epoch_end", "mid_epoch"])
def test_a_cluster_restarted_after_a_killed_worker_resumes_to_the_same_weights(
    tmp_path, one_device_loop, killed):
  """Worker-1 killed -9 after epoch 2, or mid-epoch 3 after its second call of 3 steps (step
  22) with backups every 3 steps: the restart resumes at the epoch's checkpoint (step 16), or
  at a step backup (19, or 22 when the one begun at 22 was written before the restart: never
  the epoch's start), and ends with one device's weights."""
  every = "" if killed == "epoch_end" else ", backup_every_steps: 3, backup_budget: null"
  output, result = launch(
      tmp_path, MWMS + f"checkpoint: {{dir: {tmp_path / 'checkpoints'}{every}}}\n",
      "custom_loop.py", "keras_loss", *(["2"] if killed == "epoch_end" else []),
      extra=("--max-restarts", "1"), env={"KILL_AT": "3:2"} if killed == "mid_epoch" else None)
  assert "worker-1 failed first (exit code -9)" in output
  resumed = re.search(r"tfdist: resuming at epoch (\d+), step (\d+) from", output)
  assert resumed, output[-3000:]
  assert (resumed[1], int(resumed[2])) in ([("3", 16)] if killed == "epoch_end" else
                                           [("3", 19), ("3", 22)]), resumed[0]
  assert_same([result[f"w{i}"] for i in range(4)], one_device_loop["keras_loss"][0])
  assert sorted(p.name for p in (tmp_path / "checkpoints" / "loop").iterdir())[0] == "checkpoint"


def test_the_docs_loop_runs_as_written_under_mirrored(tmp_path):
  from tests import docs_blocks
  (tmp_path / "train.py").write_text(docs_blocks.named("the custom loop").code)
  (tmp_path / "config.yaml").write_text("strategy: mirrored\ndevices: {logical_cpus: 2}\n"
                                        "training: {global_batch_size: 64}\n")
  process = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"), "--",
                         sys.executable, str(tmp_path / "train.py"))
  output = finish(process, 240, [])
  assert process.returncode == 0, output[-3000:]
  accuracies = [float(a) for a in re.findall(r"accuracy (\S+)", output)]
  assert len(accuracies) == 5 and accuracies[-1] > 0.8, output[-3000:]


def small_loop(checkpoint_dir=None, **checkpoint):
  import keras
  import tensorflow as tf
  import tfdist
  loop = tfdist.TrainingLoop({"strategy": "default", "training": TRAINING,
                              "checkpoint": {"dir": str(checkpoint_dir), **checkpoint}
                              if checkpoint_dir else {}})
  with loop.scope():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
  loop.prepare(model, optimizer)

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x) - tf.one_hot(y, 2)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return loss
  x, y = custom_loop.data()
  return loop, model, step, tf.data.Dataset.from_tensor_slices((x, y)).batch(32)


def test_each_run_is_a_pass_over_the_data_and_a_mid_epoch_save_resumes_at_its_batch(tmp_path):
  loop, model, step, dataset = small_loop()
  steps = [len(list(loop.run(step, dataset))) for _ in range(3)]  # 8 batches, 3 a call.
  assert steps == [8, 8, 8] and loop.step == 24  # One dict a step, whatever a call runs.
  uninterrupted = [w.numpy() for w in model.weights]

  loop, model, step, dataset = small_loop(tmp_path)
  for epoch in loop.epochs(3):
    steps = 4 if epoch == 1 else None
    list(loop.run(step, dataset, steps=steps))
    if epoch == 1:
      loop.save()  # Half of the second epoch done: then the machine goes away.
      break
  loop, model, step, dataset = small_loop(tmp_path)  # A new process, the same directory.
  for epoch in loop.epochs(3):
    list(loop.run(step, dataset))
  assert loop.step == 24
  assert_same([w.numpy() for w in model.weights], uninterrupted, atol=1e-6)


def test_a_step_backup_at_an_epochs_end_is_the_epochs_checkpoint_not_a_second_save(
    tmp_path, monkeypatch):
  """Epochs of 8 steps in calls of 3, 3 and 2, backups every 4 steps: TensorFlow is asked for
  each step's checkpoint once (the second epoch's steps 14 and 16)."""
  import tensorflow as tf
  asked, save = [], tf.train.CheckpointManager.save

  def recorded(manager, checkpoint_number=None, **kwargs):
    asked.append(int(checkpoint_number))
    return save(manager, checkpoint_number=checkpoint_number, **kwargs)
  monkeypatch.setattr(tf.train.CheckpointManager, "save", recorded)
  loop, _, step, dataset = small_loop(tmp_path, backup_every_steps=4, backup_budget=None)
  for _ in loop.epochs(2):
    list(loop.run(step, dataset))
  assert asked == [6, 8, 14, 16]


def test_prepare_says_what_it_takes():
  import keras
  loop, _, _, _ = small_loop()
  with pytest.raises(TypeError, match="loop.prepare takes Keras models, optimizers and metrics. "
                     "Received: str"):
    loop.prepare("model")
  with loop.scope():
    optimizer = keras.optimizers.SGD(0.1)
  with pytest.raises(ValueError, match="Received: SGD alone"):
    loop.prepare(optimizer)


def test_what_a_port_gets_wrong_is_named_in_one_line():
  """A Sequential without Input, a model built outside the loop's scope, a name the step did
  not return, arrays where a dataset goes: each one line saying what to do (not a raw
  TensorFlow error)."""
  import keras
  import tensorflow as tf
  import tfdist
  loop = tfdist.TrainingLoop({"strategy": "mirrored", "devices": {"logical_cpus": 2},
                              "training": {"global_batch_size": 32}})
  with loop.scope():
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam()
  with pytest.raises(ValueError, match=r"^loop.prepare: model 'sequential\w*' is not built yet "
                     r"\(a Sequential without keras.Input .*keras.Input\(shape\)"):
    loop.prepare(unbuilt, optimizer)
  outside = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  with pytest.raises(tfdist.ModelError, match=r"^loop.prepare: model '\w+' was built outside "
                     r"the strategy's scope.*: build it inside `with loop.scope\(\):`$"):
    loop.prepare(outside, optimizer)
  with loop.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  loop.prepare(model, optimizer)
  dataset = tf.data.Dataset.from_tensor_slices((np.ones((64, 4), "float32"),)).batch(32)
  logs = next(loop.run(lambda x: tf.reduce_mean(model(x)), dataset))
  with pytest.raises(KeyError, match=r"'loss': the step returned \['output'\]; return "
                     r"\{'loss': value\} from the step"):
    logs["loss"]
  with pytest.raises(ValueError, match=r"^dataset: TrainingLoop.run reads a tf.data.Dataset of "
                     r"global batches .* Received: ndarray$"):  # Arrays, as a fit takes them.
    next(loop.run(lambda x: tf.reduce_mean(model(x)), np.ones((64, 4), "float32")))


def test_fit_refuses_a_model_built_before_model_fn_in_one_line():
  import keras
  import tfdist
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(optimizer="sgd", loss="mse")
  with pytest.raises(tfdist.ModelError, match=r"^tfdist.fit's model_fn: model '\w+' was built "
                     r"outside the strategy's scope, so MirroredStrategy does not hold"):
    tfdist.fit(lambda: model, np.ones((64, 4), "float32"), np.ones((64, 2), "float32"),
               config={"strategy": "mirrored", "devices": {"logical_cpus": 2},
                       "training": {"global_batch_size": 32}}, verbose=0)
