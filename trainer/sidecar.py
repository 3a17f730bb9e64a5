"""The evaluator task (Vertex worker pool 3) under any strategy.

The chief exports a checkpoint per epoch to `<model_dir>/checkpoints`
(`tfdist.parameter_server.CheckpointExporter`); the evaluator evaluates each
one on the test split, appends its metrics to `<model_dir>/eval/metrics.jsonl`
(and TensorBoard events there), and exits once the chief marks training done.
"""

import os

from absl import logging
import keras

from tfdist import parameter_server
from tfdist.cluster import CHIEF, WORKER, Cluster
from tfdist.errors import UsageError
from trainer import datasets as datasets_lib
from trainer import models
from trainer.config import ExperimentConfig

CHECKPOINTS_SUBDIR = "checkpoints"
EVAL_SUBDIR = "eval"


def checkpoint_exporter(model_dir: str) -> parameter_server.CheckpointExporter | None:
    """The chief's exporter, or None when there is no model directory."""
    if not model_dir:
        return None
    return parameter_server.CheckpointExporter(os.path.join(model_dir, CHECKPOINTS_SUBDIR))


def _training_address(cluster: Cluster) -> str | None:
    # Vertex tells the evaluator where the chief is; tfdist.launch, like
    # TensorFlow, gives an evaluator a TF_CONFIG that lists only itself.
    for role in (CHIEF, WORKER):
        hosts = cluster.addresses.get(role, ())
        if hosts:
            return hosts[0]
    return None


def evaluate_checkpoints(config: ExperimentConfig, cluster: Cluster, dirs: dict) -> None:
    """Runs the evaluator task until training is done."""
    if not dirs["model_dir"]:
        raise UsageError(
            "the evaluator task has no --model_dir (and no AIP_MODEL_DIR), expected the "
            "chief's model directory, whose checkpoints/ it evaluates; pass the same "
            "--model_dir to every task")
    keras.utils.set_random_seed(config.seed)
    data = datasets_lib.load_datasets(
        config.dataset, global_batch_size=config.global_batch_size, seed=config.seed,
        num_examples=config.num_examples, data_dir=config.data_dir)
    model = models.build_model(config.model, data.info.input_shape, data.info.num_classes)
    model.compile(**models.loss_and_metrics())
    alive = None
    address = _training_address(cluster)
    if address:
        watch = parameter_server.ChiefWatch(address, gone_seconds=60.0)
        alive = lambda: not watch.gone()  # noqa: E731
    evaluator = parameter_server.SidecarEvaluator(
        model, data.test, checkpoint_dir=os.path.join(dirs["model_dir"], CHECKPOINTS_SUBDIR),
        output_dir=os.path.join(dirs["model_dir"], EVAL_SUBDIR), is_training_alive=alive)
    results = evaluator.run()
    if results:
        logging.info("Evaluated %d checkpoint(s); the last at step %d: %s", len(results),
                     max(results), results[max(results)])
