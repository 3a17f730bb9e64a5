"""An embedding table split into row blocks, one variable per block.

Keras 3 cannot train the `ShardedVariable`s that TensorFlow's variable
partitioner makes (its `train_step` and optimizers need a single variable
handle), so large tables are partitioned at the layer instead: the table is
`num_shards` ordinary variables. `ParameterServerStrategy` places variables on
the parameter servers in turn, so the blocks of one table land on different
ps tasks, and a lookup gathers rows from the blocks that hold them. Gradients
reach each block as sparse `IndexedSlices` holding only the rows a step used.
"""

import keras
import tensorflow as tf

from tfdist._internal.preconditions import check_whole_number
from tfdist.errors import UsageError

__all__ = ["shard_rows", "ShardedEmbedding"]


def shard_rows(input_dim: int, num_shards: int) -> list[int]:
    """Rows per block, TensorFlow's "div" layout: the first blocks take one extra row."""
    base, extra = divmod(input_dim, num_shards)
    return [base + 1 if shard < extra else base for shard in range(num_shards)]


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` whose table is split into `num_shards` variables.

    Row `i` of the table lives in block `b` at offset `o` as TensorFlow's
    `tf.nn.embedding_lookup` "div" strategy assigns it, so the result equals an
    `Embedding` whose table is the blocks stacked in order.

    Args:
        input_dim: Rows of the table (vocabulary size).
        output_dim: Width of each embedding.
        num_shards: Number of blocks; at most `input_dim`. Use the number of
            parameter servers (or a multiple) to spread the table over them.
        embeddings_initializer: Initializer of every block.
        **kwargs: Passed to `keras.layers.Layer`.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        num_shards: int,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("input_dim", input_dim),
            ("output_dim", output_dim),
            ("num_shards", num_shards),
        ):
            check_whole_number(f"ShardedEmbedding {name}", value, minimum=1)
        if num_shards > input_dim:
            raise UsageError(
                f"ShardedEmbedding num_shards is {num_shards} but input_dim is "
                f"{input_dim}, expected at most one block per row; lower "
                f"num_shards"
            )
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.num_shards = num_shards
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.blocks = []

    def build(self, input_shape=None):
        self.blocks = [
            self.add_weight(
                shape=(rows, self.output_dim),
                name=f"embeddings_{index}",
                initializer=self.embeddings_initializer,
            )
            for index, rows in enumerate(shard_rows(self.input_dim, self.num_shards))
        ]

    def call(self, inputs):
        ids = tf.cast(inputs, tf.int32)
        return tf.nn.embedding_lookup([block.value for block in self.blocks], ids)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "num_shards": self.num_shards,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
