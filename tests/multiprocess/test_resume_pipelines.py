"""A user's own tf.data pipeline resumes at its saved iterator position (issue #28, 3).

One module-scoped set of runs (`tests/jobs/resume_pipelines_job.py`): an
uninterrupted run, a run crashed mid-epoch at step 23 of 36, and its
restart, in one process (4 keras.io-shaped pipelines) and on 2 workers (the
unseeded TFRecord pipeline and `from_generator`). The tests compare the
weights bit for bit, count the decodes of the restart in the pipeline's own
map (a `tf.Variable`), and read the backups and the logs.
"""

import json
import pathlib
import sys

import pytest

from tests.jobs import resume_pipelines_job as job
from tests.support.logged_process import LOG_NAME, finish, log_tail, start_logged

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
WAIT_SECONDS = 600
CRASH_AT = 23  # crashes after step 23, in epoch 1 (steps 12..23) ...
RESTORED_AT = 22  # ... and resumes from the backup of step 22 (every 2 steps)
TOTAL_STEPS = job.EPOCHS * job.FILES * job.RECORDS_PER_FILE // job.GLOBAL_BATCH
ONE = list(job.CASES)
TWO = ["tfrecord_unseeded", "generator"]
PHASES = {"full": [], "crash": [f"--crash_at={CRASH_AT}"], "resume": []}


def _one_process(root: pathlib.Path, command: list[str]) -> dict:
    logs = {}
    for phase, extra in PHASES.items():
        directory = root / f"one-{phase}"
        directory.mkdir()
        backup = "full" if phase == "full" else "res"
        process = start_logged(
            [
                *command,
                f"--out={root / 'one' / phase}",
                f"--backup={root / 'one-b' / backup}",
                *extra,
            ],
            directory,
            cwd=ROOT,
        )
        code = finish(process, WAIT_SECONDS)
        assert code == 0, log_tail(process)
        logs[phase] = (directory / LOG_NAME).read_text(errors="replace")
    return logs


def _two_workers(root: pathlib.Path, command: list[str]) -> dict:
    from tfdist.launch.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top
    from tfdist.launch.testing import SHARED_PRELOADERS  # pylint: disable=g-import-not-at-top

    logs = {}
    for phase, extra in PHASES.items():
        backup = "full" if phase == "full" else "res"
        with LocalCluster(
            preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
            num_workers=2,
            env=ENV,
            log_dir=root / f"two-{phase}",
            command=[
                *command,
                f"--out={root / 'two' / phase}",
                f"--backup={root / 'two-b' / backup}",
                f"--cases={','.join(TWO)}",
                *extra,
            ],
        ) as cluster:
            codes = cluster.wait(timeout=WAIT_SECONDS)
            assert set(codes.values()) == {0}, cluster.format_logs()
        logs[phase] = [
            (root / f"two-{phase}" / f"worker-{index}.log").read_text(errors="replace")
            for index in range(2)
        ]
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_pipelines")
    command = [
        sys.executable,
        str(ROOT / "tests" / "jobs" / "resume_pipelines_job.py"),
        f"--data={root / 'data'}",
        "--write_data",
    ]
    one_logs = _one_process(root, command)
    two_logs = _two_workers(root, command)

    def result(topology, phase, case, index=0):
        return json.loads((root / topology / phase / f"{case}-{index}.json").read_text())

    return {"root": root, "result": result, "one_logs": one_logs, "two_logs": two_logs}


# timeseries_dataset_from_array ends each pass of 197 sequences with a partial batch of 5
# after a reshuffling shuffle: a state saved at that batch (the backup of step 22, with the
# prefetch 2 to 3 batches ahead, lands there in some runs) holds no seed state of the
# shuffle, and the next pass is shuffled differently (TF 2.21; measured on tf.data alone in
# tests/unit/test_resume_input_limits.py). So the timeseries case is asserted to resume and
# to say so in one line, not to be bit-equal; the other cases must be exact.
EXACT = [case for case in ONE if case != "timeseries"]


@pytest.mark.parametrize("case", EXACT)
def test_one_process_restart_equals_the_uninterrupted_run_bit_for_bit(runs, case):
    crashed = runs["result"]("one", "crash", case)
    assert crashed["error"] == "simulated crash"
    full, resumed = runs["result"]("one", "full", case), runs["result"]("one", "resume", case)
    assert resumed["error"] is None
    assert resumed["weights"] == full["weights"]


def test_timeseries_dataset_from_array_resumes_and_says_once_that_its_next_pass_may_differ(runs):
    assert runs["result"]("one", "crash", "timeseries")["error"] == "simulated crash"
    resumed = runs["result"]("one", "resume", "timeseries")
    assert resumed["error"] is None
    full = runs["result"]("one", "full", "timeseries")
    assert len(resumed["weights"]) == len(full["weights"])
    # Each process says it at its first backup, and only for this pipeline (the TFRecord
    # pipelines' passes are whole batches).
    for phase, log in runs["one_logs"].items():
        lines = [line for line in log.splitlines() if "may differ from the uninterrupted" in line]
        assert len(lines) == 1, (phase, lines)
        assert "ShuffleDatasetV3" in lines[0] and "197 examples" in lines[0], lines[0]


@pytest.mark.parametrize("case", TWO)
def test_two_worker_restart_equals_the_uninterrupted_run_bit_for_bit(runs, case):
    for index in range(2):
        assert runs["result"]("two", "crash", case, index)["error"] == "simulated crash"
        full = runs["result"]("two", "full", case, index)
        resumed = runs["result"]("two", "resume", case, index)
        assert resumed["weights"] == full["weights"], f"worker {index}"


def _decode_bound(workers: int) -> int:
    """What the restart's remaining steps consume per worker, plus buffer refill and prefetch."""
    remaining = (TOTAL_STEPS - RESTORED_AT) * job.GLOBAL_BATCH // workers
    return remaining + job.BUFFER + job.GLOBAL_BATCH // workers


@pytest.mark.parametrize("case", ["tfrecord_unseeded", "tfrecord_seeded"])
def test_one_process_restart_decodes_only_what_its_remaining_steps_need(runs, case):
    decodes = runs["result"]("one", "resume", case)["decodes"]
    # Skipping (main) decoded the 10 batches of epoch 1 before the backup again: 384.
    assert 0 < decodes <= _decode_bound(1), (decodes, _decode_bound(1))


def test_two_worker_restart_decodes_only_what_its_remaining_steps_need(runs):
    for index in range(2):
        decodes = runs["result"]("two", "resume", "tfrecord_unseeded", index)["decodes"]
        assert 0 < decodes <= _decode_bound(2), (index, decodes, _decode_bound(2))


def test_every_workers_iterator_state_is_committed_in_the_backup(runs):
    backups = sorted((runs["root"] / "two-b" / "res" / "tfrecord_unseeded").glob("backup-*"))
    assert backups
    newest = backups[-1]
    record = json.loads((newest / "metadata.json").read_text())
    for index in range(2):
        entry = record["files"][f"input-worker-{index}.state"]
        assert entry["size"] > 0 and "crc32" in entry
    assert record["user"]["input_state"]["workers"] == 2


def test_the_saved_buffer_its_op_and_size_are_logged_once_per_pipeline(runs):
    log = runs["one_logs"]["full"]
    lines = [line for line in log.splitlines() if "iterator state with every backup" in line]
    assert len(lines) == 3, lines  # the TFRecord pipelines and timeseries_dataset_from_array
    assert all("ShuffleDatasetV3" in line and "KB per worker" in line for line in lines)


def test_from_generator_says_once_that_it_cannot_be_restored(runs):
    marker = "cannot be restored to its position"
    for log in [runs["one_logs"]["crash"], *runs["two_logs"]["crash"]]:
        assert log.count(marker) == 1, log[-3000:]


def test_a_restart_of_the_same_script_finds_the_backed_up_shuffle_seeds(runs):
    # The unseeded pipeline draws its op seed from the global seed strategy_from_environment
    # sets: the restarted process draws the same, so no line about other seeds.
    for log in [runs["one_logs"]["resume"], *runs["two_logs"]["resume"]]:
        assert "Resuming from the backup" in log
        assert "shuffle seeds differ" not in log
