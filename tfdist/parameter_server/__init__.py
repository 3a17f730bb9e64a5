"""Parameter-server training for Keras 3 (which has none of its own, keras#18624).

Every task of the job runs the same program; what it does depends on its role:

- chief: builds the strategy (`make_parameter_server_strategy`), builds and
  compiles the model in its scope, and trains with `fit` /
  `ParameterServerTrainer`, exporting checkpoints with `CheckpointExporter`;
- worker and ps tasks: `serve(cluster)` until the chief has finished;
- evaluator: `SidecarEvaluator` evaluates each exported checkpoint.

See docs/parameter_server.md. TensorFlow is imported by the submodules.
"""

from tfdist.parameter_server.sharded_embedding import ShardedEmbedding
from tfdist.parameter_server.server import ChiefWatch, ServeOptions, chief_address, serve
from tfdist.evaluation import (DONE_MARKER, METRICS_FILE, CheckpointExporter,
                                             SidecarEvaluator, list_checkpoints,
                                             read_done_marker)
from tfdist.parameter_server.strategy import (make_parameter_server_strategy,
                                              training_cluster_spec, variable_partitioner)
from tfdist.parameter_server.training import (ParameterServerLostError,
                                              ParameterServerTrainer, evaluate, fit)

__all__ = ["CheckpointExporter", "ChiefWatch", "DONE_MARKER", "METRICS_FILE",
           "ParameterServerLostError", "ParameterServerTrainer", "ServeOptions",
           "ShardedEmbedding",
           "SidecarEvaluator", "chief_address", "evaluate", "fit", "list_checkpoints",
           "make_parameter_server_strategy", "read_done_marker", "serve",
           "training_cluster_spec", "variable_partitioner"]
