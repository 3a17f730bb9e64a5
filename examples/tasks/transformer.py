"""A small Transformer text classifier on fixed-length, zero-padded token sequences.

    python -m trainer.task --task=examples.tasks.transformer:TransformerTask \
        --task_config='{"sequence_length": 16}' --epochs=2 --model_dir=/tmp/transformer

The data are made here, offline and deterministically: "sentences" of random
length whose label says whether they hold more "positive" than "negative"
tokens, padded with 0 to a fixed length (dense int32 tensors, as tfdist asks).
The model: token and position embeddings, one encoder block (multi-head
self-attention that ignores padding, layer norm, a feed-forward network),
masked average pooling and logits. Plain Keras layers, plus one registered
custom layer for the position embedding, so `model.keras` loads with
`safe_mode=True` once this module is imported.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.tasks import Task

PAD = 0
NUM_CLASSES = 2
# Token ids: 0 pads; [1, 9) are "positive", [9, 17) "negative", the rest neutral.
_POSITIVE = (1, 9)
_NEGATIVE = (9, 17)


def make_sentences(
    count: int, *, vocabulary_size: int, sequence_length: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`count` zero-padded int32 sequences and their labels (1: more positive tokens).

    Sentences are 4 to `sequence_length` tokens long; a tie between positive
    and negative tokens is broken by changing the last token to the other side.
    """
    if vocabulary_size <= _NEGATIVE[1]:
        raise ValueError(
            f"vocabulary_size is {vocabulary_size}, expected more than "
            f"{_NEGATIVE[1]} (the sentiment tokens) to leave neutral ones"
        )
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocabulary_size, size=(count, sequence_length))
    lengths = rng.integers(4, sequence_length + 1, size=count)
    tokens = np.where(np.arange(sequence_length)[None, :] < lengths[:, None], tokens, PAD)
    positive, negative = _sentiment_counts(tokens)
    ties = np.flatnonzero(positive == negative)
    last = tokens[ties, lengths[ties] - 1]
    last_is_positive = (last >= _POSITIVE[0]) & (last < _POSITIVE[1])
    tokens[ties, lengths[ties] - 1] = np.where(last_is_positive, _NEGATIVE[0], _POSITIVE[0])
    positive, negative = _sentiment_counts(tokens)
    labels = (positive > negative).astype(np.int32)
    return tokens.astype(np.int32), labels


def _sentiment_counts(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positive = ((tokens >= _POSITIVE[0]) & (tokens < _POSITIVE[1])).sum(axis=1)
    negative = ((tokens >= _NEGATIVE[0]) & (tokens < _NEGATIVE[1])).sum(axis=1)
    return positive, negative


@keras.saving.register_keras_serializable(package="tfdist_examples")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to its token's embedding.

    Passes the padding mask of its input on.
    """

    def __init__(self, sequence_length: int, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.supports_masking = True

    def build(self, input_shape):
        self.positions = self.add_weight(
            shape=(self.sequence_length, input_shape[-1]),
            name="positions",
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, inputs):
        length = keras.ops.shape(inputs)[1]
        return inputs + keras.ops.cast(self.positions[:length], inputs.dtype)

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length}


def transformer_classifier(
    *, vocabulary_size: int, sequence_length: int, width: int, num_heads: int, dropout: float
) -> keras.Model:
    """Embeddings, one post-norm encoder block, masked mean pooling, logits."""
    tokens = keras.Input((sequence_length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocabulary_size, width, mask_zero=True, name="token_embedding")(
        tokens
    )
    x = PositionEmbedding(sequence_length, name="position_embedding")(x)
    # Keras passes the padding mask of `x` on as the attention mask.
    attention = keras.layers.MultiHeadAttention(
        num_heads, width // num_heads, dropout=dropout, name="self_attention"
    )(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="attention_norm")(
        keras.layers.Add(name="attention_residual")([x, attention])
    )
    hidden = keras.layers.Dense(2 * width, activation="gelu", name="ffn_in")(x)
    hidden = keras.layers.Dense(width, name="ffn_out")(hidden)
    hidden = keras.layers.Dropout(dropout, name="ffn_dropout")(hidden)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="ffn_norm")(
        keras.layers.Add(name="ffn_residual")([x, hidden])
    )
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)  # ignores padding via the mask
    outputs = keras.layers.Dense(NUM_CLASSES, dtype="float32", name="logits")(x)
    return keras.Model(tokens, outputs, name="transformer_classifier")


class TransformerTask(Task):
    """Token-counting "sentiment" with a one-block Transformer.

    Args:
        vocabulary_size: Token ids are in [0, vocabulary_size); 0 pads.
        sequence_length: Every sequence is padded to this many tokens.
        width: Embedding width (split among the heads).
        num_heads: Attention heads.
        dropout: Dropout rate in attention and the feed-forward network.
        num_examples: Training examples; evaluation has a quarter as many.
        data_seed: Fixes the sentences (the training order is fixed by `--seed`).
    """

    def __init__(
        self,
        vocabulary_size: int = 64,
        sequence_length: int = 16,
        width: int = 32,
        num_heads: int = 2,
        dropout: float = 0.1,
        num_examples: int = 2048,
        data_seed: int = 0,
    ):
        self.vocabulary_size = vocabulary_size
        self.sequence_length = sequence_length
        self.width = width
        self.num_heads = num_heads
        self.dropout = dropout
        self.num_examples = num_examples
        self.data_seed = data_seed

    def build_model(self) -> keras.Model:
        return transformer_classifier(
            vocabulary_size=self.vocabulary_size,
            sequence_length=self.sequence_length,
            width=self.width,
            num_heads=self.num_heads,
            dropout=self.dropout,
        )

    def build_inputs(self, training: bool) -> tf.data.Dataset:
        count = self.num_examples if training else max(self.num_examples // 4, 1)
        tokens, labels = make_sentences(
            count,
            vocabulary_size=self.vocabulary_size,
            sequence_length=self.sequence_length,
            seed=self.data_seed * 2 + (0 if training else 1),
        )
        return tf.data.Dataset.from_tensor_slices((tokens, labels))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self) -> list:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
