"""A training task that prints `FIRST_STEP <unix time>` when its first step has finished."""

import time

import keras
import numpy as np

import tfdist

first = keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: batch == 0 and print(f"FIRST_STEP {time.time()}",
                                                                flush=True))
x = np.random.default_rng(0).random((512, 8), dtype=np.float32)
tfdist.fit(lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]), x, x[:, 0],
           compile=dict(optimizer="sgd", loss="mse"), batch_size=64, epochs=1, verbose=0,
           callbacks=[first],
           config=tfdist.load_config())
