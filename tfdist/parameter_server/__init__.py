"""Parameter-server training for Keras 3 (which has none of its own, keras#18624).

Every task of the job runs the same program; what it does depends on its role:

- chief: builds the strategy (`make_parameter_server_strategy`), builds and
  compiles the model in its scope, and trains with `fit` /
  `ParameterServerTrainer`, exporting checkpoints with `tfdist.callbacks.CheckpointExporter`;
- worker and ps tasks: `serve(cluster)` until the chief has finished;
- evaluator: `tfdist.outputs.evaluation.SidecarEvaluator` evaluates each exported checkpoint.

See docs/parameter_server.md. TensorFlow is imported by the submodules.
"""

import importlib
import warnings

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

# Sidecar evaluation works under every strategy; its names were re-exported here
# before it moved out. Still importable from here, with a warning.
_EVALUATION_NAMES = {
    "CheckpointExporter": "tfdist.callbacks",
    "DONE_MARKER": "tfdist.outputs.evaluation",
    "METRICS_FILE": "tfdist.outputs.evaluation",
    "SidecarEvaluator": "tfdist.outputs.evaluation",
    "list_checkpoints": "tfdist.outputs.evaluation",
    "read_done_marker": "tfdist.outputs.evaluation",
}


def __getattr__(name: str):
    if name in _EVALUATION_NAMES:
        module = _EVALUATION_NAMES[name]
        warnings.warn(
            f"tfdist.parameter_server.{name} moved to {module}.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
