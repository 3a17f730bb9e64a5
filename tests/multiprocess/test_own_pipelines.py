"""Users' own keras.io-shaped tf.data pipelines on 2 workers, against one process.

One job (`tests/jobs/own_pipelines_job.py`) runs every case in sequence, once in
one process and once on a 2-worker cluster, side by side; the tests read the
results each process wrote per case: errors, steps per epoch, history,
`evaluate` results and decodes counted in the pipelines' decode maps.
"""

import json
import pathlib
import sys

import pytest

from tests.jobs import own_pipelines_job as job
from tests.support.logged_process import finish, log_tail, start_logged

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
WAIT_SECONDS = 600
# Cases whose pipeline ends an epoch with a partial training batch: Keras splits
# it unevenly among replicas (5 + 4 of 9), so their losses are not one process's.
PARTIAL_TRAINING_BATCH = {"timeseries"}
SPEC_CASES = ["timeseries", "generator", "py_function", "ragged", "sparse_dict", "strings"]
FILE_CASES = ["one_file"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`{"one": {case: result}, "two": [{case: result} per worker], "logs": [worker log]}`."""
    from tfdist.launch.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top
    from tfdist.launch.testing import SHARED_PRELOADERS  # pylint: disable=g-import-not-at-top

    root = tmp_path_factory.mktemp("own_pipelines")
    job.write_data(str(root / "data"))
    command = [sys.executable, str(ROOT / "tests" / "jobs" / "own_pipelines_job.py")]
    (root / "one").mkdir()
    single = start_logged(
        [*command, f"--data={root / 'data'}", f"--out={root / 'one'}"], root / "one", cwd=ROOT
    )
    try:
        with LocalCluster(
            preload_servers=SHARED_PRELOADERS.get,  # one import of TensorFlow per pytest process
            num_workers=2,
            env=ENV,
            log_dir=root / "two-logs",
            command=[*command, f"--data={root / 'data'}", f"--out={root / 'two'}"],
        ) as cluster:
            codes = cluster.wait(timeout=WAIT_SECONDS)
            assert set(codes.values()) == {0}, cluster.format_logs()
    finally:
        code = finish(single, WAIT_SECONDS)
    assert code == 0, log_tail(single)

    def results(directory: pathlib.Path, index: int) -> dict:
        return {
            case: json.loads((directory / f"{case}-{index}.json").read_text())
            for case in SPEC_CASES + FILE_CASES
        }

    return {
        "one": results(root / "one", 0),
        "two": [results(root / "two", index) for index in range(2)],
        "logs": [
            (root / "two-logs" / f"worker-{index}.log").read_text(errors="replace")
            for index in range(2)
        ],
    }


def _errors(result: dict) -> str:
    return f"{result['error']}\n{result.get('traceback', '')}"


@pytest.mark.parametrize("case", SPEC_CASES)
def test_a_pipeline_keras_trains_in_one_process_trains_on_two_workers(runs, case):
    one = runs["one"][case]
    assert one["error"] is None, _errors(one)
    for worker in runs["two"]:
        result = worker[case]
        assert result["error"] is None, _errors(result)
        # Each example once per epoch: the step count of one process at the global batch.
        assert result["steps"] == one["steps"]
        if case not in PARTIAL_TRAINING_BATCH:
            for key, values in one["history"].items():
                assert result["history"][key] == pytest.approx(values, abs=1e-5), key


@pytest.mark.parametrize("case", FILE_CASES)
def test_one_file_each_example_once_and_evaluation_shared(runs, case):
    one = runs["one"][case]
    assert one["error"] is None, _errors(one)
    for worker in runs["two"]:
        result = worker[case]
        assert result["error"] is None, _errors(result)
        assert result["steps"] == one["steps"] == [job.TRAIN_LINES // job.GLOBAL_BATCH]
        # Validation in fit and evaluate: metrics summed over disjoint examples,
        # partial last batch (100 = 3 x 32 + 4) and weighted metrics included.
        for key in ("val_loss", "val_accuracy", "val_auc", "val_weighted_accuracy"):
            assert result["history"][key] == pytest.approx(one["history"][key], abs=1e-6), key
        assert result["evaluate"] == pytest.approx(one["evaluate"], abs=1e-6)
        # Each worker decodes only its half of the validation split.
        assert one["evaluate_decodes"] == job.VALIDATION_LINES
        assert result["evaluate_decodes"] == job.VALIDATION_LINES // 2
        assert result["decodes"]["validation"] == 2 * job.VALIDATION_LINES // 2


def test_the_policy_chosen_for_fewer_files_than_workers_is_logged_once(runs):
    for log in runs["logs"]:
        lines = log.splitlines()
        by_record = [line for line in lines if "(sharded by record)" in line]
        whole = [line for line in lines if "The training data reads fewer files" in line]
        assert len(by_record) == 1, by_record
        assert len(whole) == 1, whole
        assert "DATA shard policy" in whole[0]


EVALUATION_EXAMPLES = 100  # at a global batch of 64: 64 + a partial 36


@pytest.mark.parametrize("kind", ["dataset", "array_record"])
def test_the_trainer_evaluates_one_file_shared_among_workers_as_one_process(
    local_cluster, tmp_path, kind
):
    from tests.jobs.tasks import record_tasks  # pylint: disable=g-import-not-at-top

    # One training file: DATA sharding, so both runs train on the same batches.
    train = record_tasks.write_tfrecords(str(tmp_path / "train"), 512, num_files=1)
    if kind == "dataset":
        evaluation = record_tasks.write_tfrecords(
            str(tmp_path / "eval"), EVALUATION_EXAMPLES, num_files=1, seed=1
        )
        train_kind = "dataset"
    else:
        evaluation = record_tasks.write_array_records(
            str(tmp_path / "eval"), EVALUATION_EXAMPLES, num_files=1, seed=1
        )
        train_kind = "array_record"
        train = record_tasks.write_array_records(str(tmp_path / "train"), 512)

    def flags(name: str) -> list[str]:
        counts = tmp_path / name / "counts"
        counts.mkdir(parents=True)
        config = {
            "pattern": train,
            "eval_pattern": evaluation,
            "kind": train_kind,
            "count_dir": str(counts),
        }
        return [
            sys.executable,
            "-m",
            "trainer.task",
            "--task=tests.jobs.tasks.shared_evaluation:SharedEvaluation",
            f"--task_config={json.dumps(config)}",
            "--global_batch_size=64",
            "--epochs=1",
            "--steps_per_epoch=4",
            "--optimizer=sgd",
            "--learning_rate=0.05",
            f"--model_dir={tmp_path / name / 'model'}",
        ]

    cluster = local_cluster(
        num_workers=2, env=ENV, command=[*flags("two"), "--strategy=multiworker"]
    )
    cluster.start()
    single = start_logged([*flags("one"), "--strategy=default"], tmp_path / "one", cwd=ROOT)
    try:
        codes = cluster.wait(timeout=WAIT_SECONDS)
        assert set(codes.values()) == {0}, cluster.format_logs()
    finally:
        assert finish(single, WAIT_SECONDS) == 0, log_tail(single)

    def summary(name):
        return json.loads((tmp_path / name / "model" / "summary.json").read_text())

    def decodes(name):
        return sorted(
            json.loads(path.read_text())["decodes"]
            for path in (tmp_path / name / "counts").glob("evaluation-*.json")
        )

    one, two = summary("one")["metrics"]["test"], summary("two")["metrics"]["test"]
    assert set(one) == {"loss", "accuracy"}
    assert two == pytest.approx(one, abs=1e-6)
    # Today's main: [100, 100] (every worker decoded the whole split).
    assert decodes("one") == [EVALUATION_EXAMPLES]
    assert decodes("two") == [EVALUATION_EXAMPLES // 2] * 2
