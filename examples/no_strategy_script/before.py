"""A keras.io-style script with no strategy: arrays, `validation_split`, `class_weight`.

    python examples/no_strategy_script/before.py OUTPUT_DIR

The shape of keras.io's "Imbalanced classification: credit card fraud detection" (on
synthetic data: nothing is downloaded): NumPy arrays normalized by their mean and std,
a model built at the top level, `model.fit(x, y, batch_size=..., validation_split=...,
class_weight=...)`. after.py is the same script on tfdist in three changed lines.

    python -m tfdist.launch --workers 2 -- python examples/no_strategy_script/after.py OUT

after.py runs the same on one process or many (TF_CONFIG / CLUSTER_SPEC), shuffles the
arrays every epoch with a seed, backs up to OUT/backup every 10 steps and at every epoch's
end, and after any stop (kill -9 included) resumes at the exact step when run again.
"""

import sys

import keras
import numpy as np

OUT = sys.argv[1]
keras.utils.set_random_seed(1)

rng = np.random.default_rng(0)
features = rng.normal(size=(1000, 30)).astype("float32")
targets = (features[:, 0] + 0.5 * features[:, 1] > 1.4).astype("int32")  # about 1 in 10
features = (features - features.mean(axis=0)) / features.std(axis=0)
counts = np.bincount(targets)
class_weight = {0: 1.0 / counts[0], 1: 1.0 / counts[1]}

model = keras.Sequential(
    [
        keras.Input((30,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(1e-2),
    loss="binary_crossentropy",
    metrics=[
        keras.metrics.FalseNegatives(name="fn"),
        keras.metrics.FalsePositives(name="fp"),
        keras.metrics.TrueNegatives(name="tn"),
        keras.metrics.TruePositives(name="tp"),
        keras.metrics.Precision(name="precision"),
        keras.metrics.Recall(name="recall"),
    ],
)
model.fit(
    features,
    targets,
    batch_size=64,
    epochs=4,
    verbose=2,
    validation_split=0.2,
    class_weight=class_weight,
)
model.save(f"{OUT}/model.keras")
