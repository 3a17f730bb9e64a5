"""Parameter-server training for Keras 3 (which has none of its own, keras#18624).

Every task of the job runs the same program; what it does depends on its role:

- chief: builds the strategy (`make_parameter_server_strategy`), builds and
  compiles the model in its scope, and trains with `fit` /
  `ParameterServerTrainer`, exporting checkpoints with `tfdist.callbacks.CheckpointExporter`;
- worker and ps tasks: `serve(cluster)` until the chief has finished;
- evaluator: `tfdist.outputs.evaluation.SidecarEvaluator` evaluates each exported checkpoint.

See docs/parameter_server.md. TensorFlow is imported by the submodules.
"""

from tfdist.parameter_server.server import ChiefWatch, ServeOptions, chief_address, serve
from tfdist.parameter_server.sharded_embedding import ShardedEmbedding
from tfdist.parameter_server.strategy import (
    make_parameter_server_strategy,
    training_cluster_spec,
    variable_partitioner,
    watch_training_tasks,
)
from tfdist.parameter_server.training import (
    ParameterServerLostError,
    ParameterServerTrainer,
    evaluate,
    fit,
)
from tfdist.parameter_server.worker_positions import WorkerPositions, per_worker_dataset_fn

__all__ = [
    "ChiefWatch",
    "ParameterServerLostError",
    "ParameterServerTrainer",
    "ServeOptions",
    "ShardedEmbedding",
    "WorkerPositions",
    "chief_address",
    "evaluate",
    "fit",
    "make_parameter_server_strategy",
    "per_worker_dataset_fn",
    "serve",
    "training_cluster_spec",
    "variable_partitioner",
    "watch_training_tasks",
]
