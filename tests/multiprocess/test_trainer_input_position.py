"""A trainer task's own dataset resumes at its backed-up iterator position (issue #28, 3).

`python -m trainer.task --task=...:ShuffledRecords` (`tests/jobs/tasks/resumed_records.py`:
`TFRecordDataset(2 files).map(decode).shuffle(64)`, unseeded and reshuffled
each pass, 320 JPEG records) in one process: 2 epochs of 20 steps of 16, a
backup every 4 steps, run uninterrupted, and killed with SIGKILL during a
step, then restarted. The trainer shuffles each pass of 320 in one window and
keeps it in memory (`tfdist.data.streaming.training_batches`): the backup holds
that window's state, and once the pass is cached, the cache.

- killed in step 14, restarted from the backup of step 12 (two `fit` calls:
  the rest of epoch 1, then epoch 2): no example of epoch 1 is decoded again,
  the cache of epoch 2 is filled again (320 decodes);
- killed in step 26, restarted from the backup of step 24: nothing is decoded
  for the 16 steps left (the cache is in the backup).

Both restarts end bit-equal to the uninterrupted run. On 2 workers
(`--strategy=multiworker`), both killed in step 14, the restart from each
worker's own state in the backup of step 12 ends bit-equal too, with one file
(every worker reads the whole global batches and keeps its part) and with two
(each worker reads its own file: before, no state was saved and the restart
skipped). `--max_input_state_mb=0` saves no position and the restart skips,
each said in one line. Before, the restart
skipped the batches already taken, decoded the whole pass again (320) in both
cases and ended with other weights (max |difference| 0.0013): the task's
reshuffling shuffle had been iterated once more in the first run (to count
the examples) than in the restart.
"""

import json
import pathlib
import signal

import keras
import numpy as np
import pytest

from tests.jobs.tasks import record_tasks, resumed_records
from tests.support.backup_files import committed_steps
from tests.support.logged_process import LOG_NAME, finish, log_tail, start_logged

REPO = pathlib.Path(__file__).resolve().parents[2]
WAIT_SECONDS = 300
NUM_EXAMPLES, GLOBAL_BATCH, EPOCHS = 320, 16, 2
TOTAL_STEPS = EPOCHS * NUM_EXAMPLES // GLOBAL_BATCH
# The one-batch check calls the loss once before training, then each step once:
# call 15 is step 14's (after the backup of step 12), call 27 step 26's.
RESTARTS = {"epoch1": (15, 12, NUM_EXAMPLES), "epoch2": (27, 24, 0)}


def _command(
    pattern: str, name: pathlib.Path, strategy: str = "default", flags=(), **config
) -> list[str]:
    return resumed_records.trainer_command(
        pattern,
        name,
        strategy=strategy,
        global_batch_size=GLOBAL_BATCH,
        epochs=EPOCHS,
        backup_every_steps=4,
        flags=flags,
        **config,
    )


def _run(command: list[str], out: pathlib.Path, expected_code: int = 0) -> str:
    out.mkdir(parents=True)
    process = start_logged(command, out, cwd=REPO)
    assert finish(process, WAIT_SECONDS) == expected_code, log_tail(process)
    return (out / LOG_NAME).read_text(errors="replace")


def _weights(model_dir: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True, compile=False)
    return [np.asarray(variable) for variable in model.weights]


def _decodes(count_dir: pathlib.Path) -> int:
    (path,) = count_dir.glob("decodes-*.json")
    return json.loads(path.read_text())["decodes"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The records' pattern, the uninterrupted run's directory, decodes and log."""
    root = tmp_path_factory.mktemp("uninterrupted")
    pattern = record_tasks.write_tfrecords(str(root / "records"), NUM_EXAMPLES, num_files=2)
    (root / "decodes").mkdir()
    log = _run(_command(pattern, root, count_dir=str(root / "decodes")), root / "log")
    return pattern, root, _decodes(root / "decodes"), log


@pytest.mark.parametrize("case", RESTARTS)
def test_a_killed_run_of_the_tasks_own_dataset_resumes_at_its_position(
    uninterrupted, tmp_path, case
):
    pattern, reference, reference_decodes, reference_log = uninterrupted
    kill_at_call, resumed_at, pass_decoded_again = RESTARTS[case]
    (tmp_path / "decodes").mkdir()
    # The same task config in both runs (the backup refuses another); SIGKILL leaves no count.
    command = _command(
        pattern,
        tmp_path,
        kill_at_call=kill_at_call,
        kill_marker=str(tmp_path / "killed.marker"),
        count_dir=str(tmp_path / "decodes"),
    )
    _run(command, tmp_path / "killed-log", -signal.SIGKILL)
    backup_dir = tmp_path / "backup"
    assert committed_steps(backup_dir)[-1] == resumed_at
    state = backup_dir / f"backup-{resumed_at:012d}" / "input-worker-0.state"
    assert state.stat().st_size > 0

    restart_log = _run(command, tmp_path / "restart-log")

    summary = json.loads((tmp_path / "model" / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["steps_completed"]) == (resumed_at, TOTAL_STEPS)
    for want, got in zip(_weights(reference / "model"), _weights(tmp_path / "model"), strict=True):
        np.testing.assert_array_equal(got, want)
    # The uninterrupted run decoded a counting pass, its checks' examples and one
    # pass (then cached); a restart reads the count from the backup directory.
    checks = reference_decodes - 2 * NUM_EXAMPLES
    decodes = _decodes(tmp_path / "decodes")
    print(
        f"{case}: uninterrupted {reference_decodes} decodes ({checks} in its checks); "
        f"restart at step {resumed_at}: {decodes}"
    )
    assert 0 <= decodes - checks <= pass_decoded_again, (decodes, checks)
    assert "skipping the batches already taken" not in restart_log
    assert reference_log.count("Backing up the training data's iterator state") == 1
    # The trainer replays its cached first pass: the task's reshuffle is drawn once.
    assert "holds no seed state" not in reference_log + restart_log


def test_a_bound_of_zero_backs_up_no_position_and_a_restart_skips(uninterrupted, tmp_path):
    pattern = uninterrupted[0]
    kill_at_call, resumed_at, _ = RESTARTS["epoch1"]
    command = _command(
        pattern,
        tmp_path,
        flags=["--max_input_state_mb=0"],
        kill_at_call=kill_at_call,
        kill_marker=str(tmp_path / "killed.marker"),
    )
    killed_log = _run(command, tmp_path / "killed-log", -signal.SIGKILL)
    assert "Not backing up the training data's position (--max_input_state_mb is 0)" in killed_log
    backup_dir = tmp_path / "backup"
    assert committed_steps(backup_dir)[-1] == resumed_at
    assert not list((backup_dir / f"backup-{resumed_at:012d}").glob("input-*"))

    restart_log = _run(command, tmp_path / "restart-log")

    assert "The backup holds no position of the training data; skipping" in restart_log
    summary = json.loads((tmp_path / "model" / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["steps_completed"]) == (resumed_at, TOTAL_STEPS)


# Files in the records: one (every worker reads the whole global batches and keeps
# its part) or two (each worker reads its own file, `distribute_datasets_from_function`).
@pytest.mark.parametrize("num_files", [1, 2])
def test_two_workers_killed_mid_epoch_resume_each_at_its_own_position(
    local_cluster, tmp_path, num_files
):
    pattern = record_tasks.write_tfrecords(
        str(tmp_path / "records"), NUM_EXAMPLES, num_files=num_files
    )
    env = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    kill_at_call, resumed_at, _ = RESTARTS["epoch1"]
    exit_codes = {}

    def run(name: str, expected: set[int], **config) -> str:
        (tmp_path / name / "decodes").mkdir(parents=True, exist_ok=True)
        config["count_dir"] = str(tmp_path / name / "decodes")
        cluster = local_cluster(
            num_workers=2,
            command=_command(pattern, tmp_path / name, "multiworker", **config),
            env=env,
        )
        cluster.start()
        codes = cluster.wait(timeout=WAIT_SECONDS, stop_on_failure=False)
        assert set(codes.values()) <= expected, cluster.format_logs()
        exit_codes[name] = sorted(codes.values())
        return cluster.format_logs()

    def decodes(name: str) -> list[int]:
        counts = (tmp_path / name / "decodes").glob("decodes-*.json")
        return sorted(json.loads(path.read_text())["decodes"] for path in counts)

    run("full", {0})
    full_decodes = decodes("full")
    kill = {"kill_at_call": kill_at_call, "kill_marker": str(tmp_path / "killed")}
    # The first worker killed in step 14 can stop the other in that step's collective
    # before its own kill: it exits 200 (a peer lost), as a job's tasks do.
    run("res", {-signal.SIGKILL, 200}, **kill)
    assert -signal.SIGKILL in exit_codes["res"], exit_codes
    backup = tmp_path / "res" / "backup"
    assert committed_steps(backup)[-1] == resumed_at
    saved = sorted(path.name for path in (backup / f"backup-{resumed_at:012d}").glob("input-*"))
    assert saved == ["input-worker-0.state", "input-worker-1.state"]
    for path in (tmp_path / "res" / "decodes").glob("*"):
        path.unlink()  # SIGKILL leaves none; nothing but the restart's counts

    logs = run("res", {0}, **kill)

    summary = json.loads((tmp_path / "res" / "model" / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["steps_completed"]) == (resumed_at, TOTAL_STEPS)
    for want, got in zip(
        _weights(tmp_path / "full" / "model"), _weights(tmp_path / "res" / "model"), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    assert "skipping the batches already taken" not in logs
    assert "holds no seed state" not in logs
    # Each worker compares its own shuffles' seeds (its files' pipeline has its own).
    assert "shuffle seeds differ" not in logs
    restart_decodes = decodes("res")
    print(
        f"{num_files} file(s): decodes per worker {full_decodes} uninterrupted, "
        f"{restart_decodes} restarted at step {resumed_at}"
    )
    assert len(restart_decodes) == len(full_decodes) == 2
    # A restart decodes no example of the 12 steps it resumed after: each worker
    # reads at most what the uninterrupted run read less those steps' share.
    taken = resumed_at * GLOBAL_BATCH // 2
    for full, restarted in zip(full_decodes, restart_decodes, strict=True):
        assert restarted <= full - taken, (full_decodes, restart_decodes)
