"""Which task a run trains: the user's `--task=MODULE:NAME`, or the built-in one."""

import dataclasses
import json

from tfdist import tasks as tasks_lib


@dataclasses.dataclass(frozen=True)
class LoadedTask:
    """A task object and how to name it.

    Attributes:
        task: The object with `build_model`, `build_inputs`, `loss`, `metrics`.
        spec: How messages name it (`--task` or `--model/--dataset`).
        identity: What decides its data and model, recorded in backups.
    """

    task: object
    spec: str
    identity: str


def load(config) -> LoadedTask:
    """Loads the task `config` asks for; runs no TensorFlow op.

    Raises:
        UsageError: A task that cannot be loaded, an unknown model or dataset.
    """
    if config.task:
        task = tasks_lib.load_task(config.task, config.task_config)
        arguments = json.dumps(tasks_lib.parse_task_config(config.task_config), sort_keys=True)
        return LoadedTask(task, config.task, f"{config.task}({arguments})")
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    task = BuiltinTask(
        model=config.model,
        dataset=config.dataset,
        data_dir=config.data_dir,
        num_examples=config.num_examples,
        seed=config.seed,
    )
    return LoadedTask(
        task,
        f"--model={config.model} --dataset={config.dataset}",
        f"{config.model}/{task.identity}",
    )
