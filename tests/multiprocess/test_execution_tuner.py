"""`tfdist.distribute.execution_tuner`: probes roll back exactly; auto trains like its explicit choice."""

import json
import pathlib
import re
import sys

import keras
import numpy as np
import pytest

from tests.support.logged_process import finish, log_tail, start_logged

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 600
_CHOSE = re.compile(r"steps_per_execution=auto chose (\d+)")


TRAINER_FLAGS = [
    "--model=mlp",
    "--dataset=synthetic",
    "--num_examples=2048",
    "--global_batch_size=32",
    "--epochs=2",
    "--seed=2",
]


def _start_trainer(tmp_path: pathlib.Path, name: str, *extra: str):
    out = tmp_path / name
    out.mkdir()
    return start_logged(
        [sys.executable, "-m", "trainer.task", *TRAINER_FLAGS, f"--model_dir={out}", *extra],
        out,
        cwd=REPO,
    )


def _finish_trainer(process):
    code = finish(process, TIMEOUT)
    assert code == 0, f"{process.out.name} exited {code}:\n{log_tail(process)}"
    return process


def _weights(out: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(out / "model.keras", safe_mode=True, compile=False)
    return model.get_weights()


@pytest.fixture(scope="module")
def single_process_runs(tmp_path_factory):
    """One process trained three ways: auto (the default), auto's choice, and 1.

    Shared by both trainer tests below, so each process starts once. The auto
    run goes alone (its choice is timed); the two explicit runs time nothing
    and run side by side.
    """
    tmp_path = tmp_path_factory.mktemp("single-process")
    auto = _finish_trainer(_start_trainer(tmp_path, "auto"))
    found = _CHOSE.findall(log_tail(auto, 100_000))
    assert len(found) == 1, log_tail(auto)
    chosen = int(found[0])
    started = [
        _start_trainer(tmp_path, "explicit", f"--steps_per_execution={chosen}"),
        _start_trainer(tmp_path, "one", "--steps_per_execution=1"),
    ]
    try:
        explicit, one = [_finish_trainer(process) for process in started]
    finally:
        for process in started:
            finish(process, 1)
    return chosen, {"auto": auto.out, "explicit": explicit.out, "one": one.out}


def test_the_trainer_defaults_to_auto_and_matches_the_explicit_choice(single_process_runs):
    _, outs = single_process_runs
    for name, out in outs.items():
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps_completed"] == 2 * 64
        for want, got in zip(_weights(outs["auto"]), _weights(out), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_two_workers_choose_the_same_value_and_train_like_one_process(
    local_cluster, tmp_path, single_process_runs
):
    common = ["-m", "trainer.task", *TRAINER_FLAGS]
    cluster = local_cluster(
        num_workers=2,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        command=[
            sys.executable,
            *common,
            "--strategy=multiworker",
            f"--model_dir={tmp_path / 'two'}",
            f"--backup_dir={tmp_path / 'backup'}",
        ],
    )
    cluster.start()
    codes = cluster.wait(timeout=TIMEOUT)
    assert set(codes.values()) == {0}, cluster.format_logs()
    # Non-chief workers log warnings only. A worker that chose another value would run
    # another number of per-execution preemption all-gathers, and the job would hang.
    chosen = _CHOSE.findall(cluster.log("worker:0"))
    assert len(chosen) == 1, cluster.format_logs()
    assert set(_CHOSE.findall(cluster.log("worker:1"))) <= set(chosen)

    # One process on the default strategy; the test above shows that every
    # steps_per_execution gives it the same weights bit for bit, so it stands
    # for one process at the workers' choice too.
    _, outs = single_process_runs
    one = json.loads((outs["one"] / "summary.json").read_text())
    assert one["strategy"] == "default", one
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (summary["num_workers"], summary["steps_completed"]) == (2, 2 * 64)
    for want, got in zip(_weights(outs["one"]), _weights(tmp_path / "two"), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
