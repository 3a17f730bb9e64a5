"""A broken packaged Vertex AI table at the command line: `python -m trainer.submit` says so in
one `error:` line and exits 2, like every other usage error (the in-process half, what the
line says for each kind of break, is tests/unit/test_vertex_tables.py).

The tables load when `trainer.vertex` is imported (the flags' defaults come from them), before
`tfdist.cli.run` can report anything: on main the `UsageError` escaped as a traceback. The
broken table is in a copy of the `trainer` package, which the command imports instead of the
checkout's (it runs in the copy's directory); the library is the checkout's."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.multiprocess.test_vertex_validation import COMMON, OUR_IMAGE, assert_one_line_usage_error

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBMIT = ["-m", "trainer.submit", *COMMON, f"--container_uri={OUR_IMAGE}", "--dry_run"]
KUBERNETES = ["-m", "trainer.kubernetes", "--name=job", f"--image={OUR_IMAGE}", "--bucket=gs://b"]


def _run(copy, argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy), REPO]))
    return subprocess.run(
        [sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def trainer_copy(tmp_path_factory):
    copy = tmp_path_factory.mktemp("copy")
    shutil.copytree(
        os.path.join(REPO, "trainer"),
        copy / "trainer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    done = _run(copy, SUBMIT)  # the same command line is accepted while the tables are whole
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["jobSpec"]["workerPoolSpecs"]
    return copy


def _cut_short(text):
    return text[: len(text) // 2]


def _image_a_number(text):
    table = json.loads(text)
    table["reduction_server"]["image"] = 3
    return json.dumps(table)


BROKEN = {
    "machines.json cut short": ("machines.json", _cut_short, "is not valid JSON"),
    "images.json empty": ("images.json", lambda text: "", "is not valid JSON"),
    "network.json a number for a text": (
        "network.json",
        _image_a_number,
        "reduction_server.image is 3, expected a non-empty string",
    ),
}


@pytest.mark.parametrize(("name", "change", "expected"), BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_table_is_one_error_line_and_exit_2(trainer_copy, name, change, expected):
    path = trainer_copy / "trainer" / "vertex" / "tables" / name
    whole = path.read_text()
    path.write_text(change(whole))
    try:
        result = _run(trainer_copy, SUBMIT)
        kubernetes = _run(trainer_copy, KUBERNETES)
    finally:
        path.write_text(whole)
    line = assert_one_line_usage_error(result, expected, "fix the file")
    assert line.startswith(f"error: Vertex AI table {path}"), line
    # trainer.kubernetes reads no Vertex table: a broken one changes nothing there.
    assert kubernetes.returncode == 0, kubernetes.stderr[-2000:]
    assert json.loads(kubernetes.stdout)["kind"] == "TFJob"
