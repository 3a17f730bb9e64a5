"""Which commands a local cluster forks from its preload server, and from which setting."""

import sys

import pytest

from tfdist.errors import UsageError
from tfdist.launch import preload
from tfdist.launch.local_cluster import LocalCluster


def test_the_variable_names_modules_separated_by_commas():
    assert preload.modules_from_environment({}) == ()
    assert preload.modules_from_environment({preload.PRELOAD_VARIABLE: ""}) == ()
    assert preload.modules_from_environment({preload.PRELOAD_VARIABLE: " tensorflow, keras ,"}) == (
        "tensorflow",
        "keras",
    )


def test_only_this_interpreter_on_a_module_or_a_script_is_forked(tmp_path):
    script = tmp_path / "task.py"
    script.write_text("print('hi')\n")
    assert preload.forkable([sys.executable, "-m", "trainer.task", "--steps=1"])
    assert preload.forkable([sys.executable, str(script), "arg"])
    assert not preload.forkable([sys.executable, "-m"])
    assert not preload.forkable([sys.executable, "-u", "-m", "trainer.task"])
    assert not preload.forkable([sys.executable, "-c", "print(1)"])
    assert not preload.forkable([sys.executable, str(tmp_path / "missing.py")])
    assert not preload.forkable(["sh", "-c", "true"])
    assert not preload.forkable([sys.executable])


@pytest.mark.parametrize("value", ["tensorflow", ["tensorflow", ""], [3]])
def test_a_bad_preload_is_a_usage_error(value):
    with pytest.raises(UsageError, match="preload is .*expected a sequence of module names"):
        LocalCluster(num_workers=1, command=[sys.executable, "-m", "json.tool"], preload=value)
