"""`--task=MODULE:NAME`: a user's model and data through the trainer, and every way to get it wrong."""

import pytest

from tfdist import tasks as tasks_lib
from tfdist.errors import UsageError

TOY = "tests.jobs.tasks.toy_tasks"


BROKEN = {
    "no colon": ("no_colon_here", None, "expected MODULE:NAME"),
    "import fails": (
        "tests.jobs.tasks.broken_import:Task",
        None,
        "cannot be imported (ModuleNotFoundError: No module named 'this_module_does_not_exist')",
    ),
    "missing name": (f"{TOY}:Missing", None, "has no callable 'Missing'"),
    "missing method": (f"{TOY}:NoLoss", None, "without loss"),
    "unknown argument": (
        f"{TOY}:SubclassedTask",
        '{"epochs": 3}',
        "does not accept the --task_config arguments ['epochs']",
    ),
    "config not an object": (f"{TOY}:SubclassedTask", "[1, 2]", "holds a JSON list"),
    "config not json": (f"{TOY}:SubclassedTask", "{bad", "is not valid JSON"),
    "config file missing": (
        f"{TOY}:SubclassedTask",
        "/no/such/file.json",
        "neither a JSON object nor an existing file",
    ),
    "inputs not a dataset": (
        f"{TOY}:ReturnsNumpy",
        None,
        "returned tuple, expected a tf.data.Dataset",
    ),
    "model not a model": (
        f"{TOY}:ReturnsALayer",
        None,
        "build_model() returned Dense, expected a keras.Model",
    ),
    "batched dicts": (f"{TOY}:Batched", None, "yields dicts with keys ['x', 'y'], expected tuples"),
    "endless": (f"{TOY}:Endless", None, "is infinite (it repeats)"),
}


@pytest.mark.parametrize("spec, task_config, expected", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_task_is_refused_before_training(spec, task_config, expected):
    with pytest.raises(UsageError) as raised:
        task = tasks_lib.load_task(spec, task_config)
        tasks_lib.preflight(task, spec)
        tasks_lib.check_examples(task.build_inputs(True), spec, training=True)
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_load_task_reports_what_the_factory_raised_for_bad_arguments():
    with pytest.raises(UsageError, match="num_exampels"):
        tasks_lib.load_task(f"{TOY}:SubclassedTask", {"num_exampels": 3})


def test_the_base_class_names_what_is_missing():
    class Half(tasks_lib.Task):
        pass

    with pytest.raises(NotImplementedError, match="Half.build_model is not implemented"):
        Half().build_model()
    assert Half().metrics() == []
