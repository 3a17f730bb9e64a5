"""TensorBoard that does no per-batch work when it records per epoch."""

import keras

__all__ = ["EpochTensorBoard"]


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """Keras's `TensorBoard` without per-batch scalar calls at `update_freq="epoch"`.

    Keras 3.15 calls `summary.scalar` for every log on every training batch even
    when it only records per epoch; on a small model that costs about a fifth
    of the step time (docs/benchmarks.md, "Trainer overhead").
    """

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, None if self.update_freq == "epoch" else logs)
