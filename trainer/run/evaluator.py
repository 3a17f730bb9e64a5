"""The evaluator task (Vertex worker pool 3) under any strategy.

The chief exports a checkpoint per epoch to `<model_dir>/checkpoints`
(`tfdist.callbacks.CheckpointExporter`); the evaluator builds the task's
model and metrics, evaluates each checkpoint on the task's evaluation split,
appends its metrics to `<model_dir>/eval/metrics.jsonl` (and TensorBoard
events there), and exits once the chief marks training done. It exits 201 on
SIGTERM (it keeps no state) and 200 if the chief stops answering for
`--peer_timeout_seconds` (frozen).
"""

from absl import logging

from tfdist.distribute.cluster import CHIEF, WORKER, Cluster
from tfdist.errors import UsageError
from tfdist.outputs import evaluation
from tfdist.parameter_server import ChiefWatch
from tfdist.preemption import exit_without_state_on_sigterm
from tfdist.tasks import custom_steps
from trainer.config import ExperimentConfig
from trainer.run.compiling import build_model
from trainer.run.directories import OutputDirs
from trainer.run.inputs import build_inputs
from trainer.run.pipeline import seed_everything
from trainer.tasks import LoadedTask


def _training_address(cluster: Cluster) -> str | None:
    # Vertex and tfdist.launch tell the evaluator where the chief is; a
    # TF_CONFIG written by hand may list only the evaluator itself.
    for role in (CHIEF, WORKER):
        hosts = cluster.addresses.get(role, ())
        if hosts:
            return hosts[0]
    return None


def evaluate(
    config: ExperimentConfig, cluster: Cluster, dirs: OutputDirs, loaded: LoadedTask
) -> None:
    """Evaluates the chief's checkpoints until training is done."""
    if not dirs.model_dir:
        raise UsageError(
            "the evaluator task has no --model_dir (and no AIP_MODEL_DIR), expected the "
            "chief's model directory, whose checkpoints/ it evaluates; pass the same "
            "--model_dir to every task"
        )
    exit_without_state_on_sigterm(f"{cluster.task_type}:{cluster.task_index}")
    seed_everything(config)
    inputs = build_inputs(loaded, config)
    if inputs.eval_examples is None:
        raise UsageError(
            f"{loaded.spec}: build_inputs(training=False) returned None, so the "
            f"evaluator task has nothing to evaluate; return evaluation examples "
            f"or run the job without an evaluator"
        )
    model = build_model(loaded, config, inputs, for_training=False)
    cannot_evaluate = custom_steps.evaluation_skip_reason(model)
    if cannot_evaluate:
        logging.warning("The evaluator task has nothing to do: %s.", cannot_evaluate)
        return
    alive = None
    address = _training_address(cluster)
    if address:
        watch = ChiefWatch(address, gone_seconds=60.0)

        def alive() -> bool:
            gone = watch.gone()
            watch.check_answering(config.peer_timeout_seconds)  # a frozen chief: exit 200
            return not gone

    evaluator = evaluation.SidecarEvaluator(
        model,
        inputs.eval_stream(),
        checkpoint_dir=dirs.checkpoints_dir,
        output_dir=dirs.eval_dir,
        is_training_alive=alive,
    )
    results = evaluator.run()
    if results:
        logging.info(
            "Evaluated %d checkpoint(s); the last at step %d: %s",
            len(results),
            max(results),
            results[max(results)],
        )
