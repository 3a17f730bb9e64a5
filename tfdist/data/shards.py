"""Which part of each global batch an input pipeline produces, and the arithmetic of passes."""

import dataclasses

from tfdist.errors import UsageError

__all__ = ["check_global_batch", "batches_per_pass", "Shard"]


def check_global_batch(global_batch_size: int, num_replicas: int) -> int:
    """The batch each replica computes on.

    Raises:
        UsageError: `global_batch_size` is not a multiple of `num_replicas`.
    """
    if global_batch_size % num_replicas:
        lower = global_batch_size - global_batch_size % num_replicas
        raise UsageError(
            f"--global_batch_size={global_batch_size} does not divide among "
            f"{num_replicas} replicas, expected a multiple of {num_replicas}; use "
            f"{lower or num_replicas} or {lower + num_replicas}"
        )
    return global_batch_size // num_replicas


def batches_per_pass(num_examples: int, global_batch_size: int) -> int:
    """Full global batches in one pass over `num_examples` examples.

    Raises:
        UsageError: Fewer examples than one global batch.
    """
    if num_examples < global_batch_size:
        raise UsageError(
            f"the training data has {num_examples} examples, fewer than one global batch "
            f"of {global_batch_size}; lower --global_batch_size or provide more examples"
        )
    return num_examples // global_batch_size


@dataclasses.dataclass(frozen=True)
class Shard:
    """One input pipeline of `count`, feeding `local_replicas` replicas.

    Pipeline `index` feeds global replicas `[index * local_replicas,
    (index + 1) * local_replicas)`, as a multi-worker strategy numbers them
    (task-major).
    """

    index: int = 0
    count: int = 1
    local_replicas: int = 1

    def __post_init__(self):
        if not 0 <= self.index < self.count or self.local_replicas < 1:
            raise ValueError(
                f"Shard(index={self.index}, count={self.count}, "
                f"local_replicas={self.local_replicas}) is not a shard"
            )

    @property
    def num_replicas(self) -> int:
        return self.count * self.local_replicas

    @property
    def first_replica(self) -> int:
        return self.index * self.local_replicas

    @classmethod
    def of(cls, input_context) -> "Shard":
        """The shard a `tf.distribute.InputContext` describes."""
        count = input_context.num_input_pipelines
        return cls(
            index=input_context.input_pipeline_id,
            count=count,
            local_replicas=input_context.num_replicas_in_sync // count,
        )
