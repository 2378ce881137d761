"""TensorFlow's "Parameter server training" tutorial, the whole page as its coordinator's
program, with no tfdist in it, for a real cluster (the page's "Clusters in the real world":
`TFConfigClusterResolver`, the workers and ps tasks serving elsewhere): a
`ParameterServerStrategy` with the page's `MinSizePartitioner`; "If you use the same binary
for all tasks" (a worker or ps task serves; an evaluator runs the page's sidecar evaluation loop over the chief's
checkpoints); "Training with Model.fit" (a dataset, a Dense model compiled with
`steps_per_execution`, TensorBoard, ModelCheckpoint (each epoch's file named by Keras's
`{epoch}`, which the sidecar's loop ends on) and BackupAndRestore, `model.fit(epochs,
steps_per_epoch)`); "Training with a custom training
loop" (StringLookup preprocessing made in the scope, a dataset function, an Embedding model,
RMSprop, an accuracy metric, the `ClusterCoordinator`, a per-worker dataset, `schedule` and
`join` over epochs, a `RemoteValue` fetched); inline and distributed evaluation. The toy data
is seeded (the page's is not). Keras 3 has no `optimizers.legacy`: Keras's SGD and RMSprop; its
metrics spell `reset_states` `reset_state`. The page's check that the embedding is split in two
needs two ps tasks (Keras 3 cannot train a split variable either). Keras 3's functional models
take batches only: the datasets' maps call the page's lookup layers, which its preprocessing
models wrap. Keras 3's ops take Keras tensors (`keras.ops.mean`), and its variables keep their
TensorFlow variable in `.value`.

Usage: python tf_parameter_server.py WORKDIR [fit|loop|both]. Prints `RESULT <section> <json>`.
"""

import json
import os
import random
import sys
import time

import numpy as np
import tensorflow as tf

WORKDIR = sys.argv[1]
PARTS = sys.argv[2] if len(sys.argv) > 2 else "both"
tf.keras.utils.set_random_seed(0)


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


os.environ["GRPC_FAIL_FAST"] = "use_caller"
cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
NUM_PS = len(cluster_resolver.cluster_spec().as_dict().get("ps", []))
working_dir = os.path.join(WORKDIR, "my_working_dir")
train_epochs = 5


def toy_data():
  x = tf.random.uniform((10, 10), seed=1)
  y = tf.random.uniform((10, 1), seed=2)  # tf-keras's mse expanded the page's (10,).
  return x, y


def sidecar_evaluation():
  """The page's custom evaluation loop of a sidecar evaluator: each new checkpoint restored
  and evaluated, until the last epoch's (Keras 3's ModelCheckpoint writes `.keras` files,
  read by `load_model`; one still being written is tried again, as the page does)."""
  x, y = toy_data()
  eval_data = tf.data.Dataset.from_tensor_slices((x, y)).batch(10)
  evaluated, last_eval = [], None
  while True:
    checkpoints = sorted(f for f in (os.listdir(working_dir) if os.path.isdir(working_dir)
                                     else []) if f.startswith("ckpt-"))
    latest_checkpoint = max(checkpoints, key=lambda f: int(f[5:-6]), default=None)
    if latest_checkpoint and latest_checkpoint != last_eval:
      try:
        eval_model = tf.keras.models.load_model(os.path.join(working_dir, latest_checkpoint))
      except Exception:  # A checkpoint still being written: the page tries again.
        continue
      evaluated.append((latest_checkpoint, eval_model.evaluate(eval_data, verbose=0)))
      last_eval = latest_checkpoint
      if latest_checkpoint.endswith("-{}.keras".format(train_epochs)):
        break
    time.sleep(0.2)
  report("sidecar", evaluated)


# If you use the same binary for all tasks (the page's "Clusters in the real world").
if cluster_resolver.task_type in ("worker", "ps"):
  server = tf.distribute.Server(cluster_resolver.cluster_spec(),
                                job_name=cluster_resolver.task_type,
                                task_index=cluster_resolver.task_id,
                                protocol=cluster_resolver.rpc_layer or "grpc", start=True)
  server.join()
elif cluster_resolver.task_type == "evaluator":
  sidecar_evaluation()
  sys.exit(0)

variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=NUM_PS)
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver,
                                                 variable_partitioner=variable_partitioner)

# Training with Model.fit.
if PARTS in ("fit", "both"):
  global_batch_size = 64
  x, y = toy_data()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10, seed=3).repeat()
  dataset = dataset.batch(global_batch_size)
  dataset = dataset.prefetch(2)

  with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
    model.compile(tf.keras.optimizers.SGD(), loss="mse", steps_per_execution=10)

  log_dir = os.path.join(working_dir, "log")
  ckpt_filepath = os.path.join(working_dir, "ckpt-{epoch}.keras")
  backup_dir = os.path.join(working_dir, "backup")
  callbacks = [
      tf.keras.callbacks.TensorBoard(log_dir=log_dir),
      tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
      tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir)]
  history = model.fit(dataset, epochs=train_epochs, steps_per_epoch=20, callbacks=callbacks)
  report("fit", {"epochs": len(history.history["loss"]),
                 "iterations": int(model.optimizer.iterations.numpy())})
  report("fit_loss", history.history["loss"])
  report("fit_files", sorted(os.listdir(working_dir)))

# Training with a custom training loop.
if PARTS in ("loop", "both"):
  tf.keras.utils.set_random_seed(0)  # Each section seeded alike, whichever ran before it.
  feature_vocab = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong",
                   "wonder_woman"]
  label_vocab = ["yes", "no"]

  with strategy.scope():
    feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=feature_vocab,
                                                        mask_token=None)
    label_lookup_layer = tf.keras.layers.StringLookup(vocabulary=label_vocab,
                                                      num_oov_indices=0, mask_token=None)
    raw_feature_input = tf.keras.layers.Input(shape=(3,), dtype=tf.string, name="feature")
    feature_id_input = feature_lookup_layer(raw_feature_input)
    feature_preprocess_stage = tf.keras.Model({"features": raw_feature_input},
                                              feature_id_input)
    raw_label_input = tf.keras.layers.Input(shape=(1,), dtype=tf.string, name="label")
    label_id_input = label_lookup_layer(raw_label_input)
    label_preprocess_stage = tf.keras.Model({"label": raw_label_input}, label_id_input)

  def feature_and_label_gen(num_examples=200):
    examples = {"features": [], "label": []}
    for _ in range(num_examples):
      features = random.sample(feature_vocab, 3)
      label = ["yes"] if "avenger" in features else ["no"]
      examples["features"].append(features)
      examples["label"].append(label)
    return examples

  examples = feature_and_label_gen()

  def dataset_fn(_):
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
    train_dataset = raw_dataset.map(
        lambda x: ({"features": feature_lookup_layer(x["features"])},
                   label_lookup_layer(x["label"]))).shuffle(200, seed=4).batch(32).repeat()
    return train_dataset

  with strategy.scope():
    model_input = tf.keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
    emb_layer = tf.keras.layers.Embedding(
        input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
    emb_output = tf.keras.ops.mean(emb_layer(model_input), axis=1)  # Keras 3: no tf op here.
    dense_output = tf.keras.layers.Dense(
        units=1, activation="sigmoid",
        kernel_regularizer=tf.keras.regularizers.L2(1e-4))(emb_output)
    model = tf.keras.Model({"features": model_input}, dense_output)
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.1)
    accuracy = tf.keras.metrics.Accuracy()

  print(emb_layer.weights[0].value.device)  # Keras 3: the tf.Variable is `.value`.

  @tf.function
  def step_fn(iterator):

    def replica_fn(batch_data, labels):
      with tf.GradientTape() as tape:
        pred = model(batch_data, training=True)
        per_example_loss = tf.keras.losses.BinaryCrossentropy(reduction="none")(labels, pred)
        loss = tf.nn.compute_average_loss(per_example_loss)
        model_losses = model.losses
        if model_losses:
          loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      accuracy.update_state(labels, actual_pred)
      return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

  @tf.function
  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
  per_worker_iterator = iter(per_worker_dataset)

  num_epochs = 4
  steps_per_epoch = 5
  accuracies = []
  for i in range(num_epochs):
    accuracy.reset_state()
    for _ in range(steps_per_epoch):
      coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()))
    accuracies.append(float(accuracy.result().numpy()))
  report("loop_accuracy", accuracies)
  report("loop_counted", float(accuracy.count.numpy()) if hasattr(accuracy, "count") else None)

  loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
  print("Final loss is %f" % loss.fetch())
  report("final_loss", float(loss.fetch()))

  # Inline evaluation, on the coordinator.
  eval_dataset = tf.data.Dataset.from_tensor_slices(feature_and_label_gen(num_examples=16)).map(
      lambda x: ({"features": feature_lookup_layer(x["features"])},
                 label_lookup_layer(x["label"]))).batch(8)
  eval_accuracy = tf.keras.metrics.Accuracy()
  for batch_data, labels in eval_dataset:
    pred = model(batch_data, training=False)
    actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
    eval_accuracy.update_state(labels, actual_pred)
  print("Evaluation accuracy: %f" % eval_accuracy.result())
  report("inline_evaluation", float(eval_accuracy.result()))

  # Distributed evaluation, on the workers.
  with strategy.scope():
    eval_accuracy = tf.keras.metrics.Accuracy()

  @tf.function
  def eval_step(iterator):
    def replica_fn(batch_data, labels):
      pred = model(batch_data, training=False)
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      eval_accuracy.update_state(labels, actual_pred)
    batch_data, labels = next(iterator)
    strategy.run(replica_fn, args=(batch_data, labels))

  eval_examples = feature_and_label_gen(num_examples=16)

  def eval_dataset_fn():
    return tf.data.Dataset.from_tensor_slices(eval_examples).map(
        lambda x: ({"features": feature_lookup_layer(x["features"])},
                   label_lookup_layer(x["label"]))).shuffle(16, seed=5).repeat().batch(8)

  per_worker_eval_dataset = coordinator.create_per_worker_dataset(eval_dataset_fn)
  per_worker_eval_iterator = iter(per_worker_eval_dataset)
  eval_steps_per_epoch = 2
  for _ in range(eval_steps_per_epoch):
    coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
  coordinator.join()
  print("Evaluation accuracy: %f" % eval_accuracy.result())
  report("distributed_evaluation", float(eval_accuracy.result()))
