"""`python -m trainer.task` as a user runs it: outputs, summary, exit codes, messages."""

import json
import math
import os
import pathlib
import select
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from tests.support.forked_runs import run_forked_trainers
from tests.support.logged_process import run_side_by_side
from tfdist._internal import startup_logs
from trainer import config as config_lib
from trainer.tasks import datasets as datasets_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 300  # A backstop against hangs, never a speed assertion.
SHORT = ("--epochs=1", "--steps_per_epoch=5", "--num_examples=512")
# For runs whose assertions hold for any execution length: auto's probe traces and
# times a step function per candidate, which tests/multiprocess/test_execution_tuner.py covers.
PINNED_EXECUTION = "--steps_per_execution=1"


def clean_environ(extra: dict | None = None) -> dict:
    """This process's environment without cluster or Vertex variables, plus `extra`."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC") and not key.startswith("AIP_")
    }
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for key, value in (extra or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return environ


def trainer_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer.task", *args]


def run_task(*args: str, env: dict | None = None, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainer_command(*args),
        cwd=cwd,
        env=clean_environ(env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def run_tasks_side_by_side(*arg_lists: list[str]) -> list[subprocess.CompletedProcess]:
    """`run_task` for independent runs (separate output dirs), all started at once."""
    return run_side_by_side(
        [(trainer_command(*args), clean_environ()) for args in arg_lists], cwd=REPO, timeout=TIMEOUT
    )


def describe(result: subprocess.CompletedProcess) -> str:
    return (
        f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-5000:]}"
    )


def assert_usage_error(
    result: subprocess.CompletedProcess, *fragments: str, only_line: bool = True
) -> str:
    """Exit 2, one `error:` line (the last one) holding `fragments`, no traceback.

    Args:
        only_line: The error is detected before TensorFlow is imported, so the
            error line must be all there is on stderr.
    """
    assert result.returncode == 2, describe(result)
    assert "Traceback" not in result.stderr + result.stdout, describe(result)
    lines = result.stderr.strip().splitlines()
    error_lines = [line for line in lines if line.startswith("error:")]
    assert len(error_lines) == 1, describe(result)
    assert lines[-1] == error_lines[0], describe(result)
    for fragment in fragments:
        assert fragment in error_lines[0], describe(result)
    if only_line:
        assert lines == error_lines, describe(result)
    assert result.stdout == "", describe(result)
    return error_lines[0]


# --- Successful runs ---------------------------------------------------------


def test_embedded_default_needs_only_a_model_dir(tmp_path):
    model_dir = tmp_path / "model"
    vertex_dir = tmp_path / "vertex-model"
    result = run_task(f"--model_dir={model_dir}", env={"AIP_MODEL_DIR": str(vertex_dir)})
    assert result.returncode == 0, describe(result)
    assert (model_dir / "model.keras").is_file()
    summary = json.loads((model_dir / "summary.json").read_text())
    defaults = config_lib.ExperimentConfig()
    assert summary["epochs"] == defaults.epochs
    assert summary["global_batch_size"] == defaults.global_batch_size
    assert summary["steps_completed"] == defaults.epochs * summary["steps_per_epoch"]
    assert summary["metrics"]["test"]["accuracy"] > 0.5  # 10 classes: chance is 0.1.
    assert not vertex_dir.exists(), "--model_dir must win over AIP_MODEL_DIR"


SHORT_RUN = {"epochs": 2, "steps_per_epoch": 5, "batch": 32, "num_examples": 512, "seed": 3}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short run as on Vertex AI, with the user's view of the output.

    Its model and TensorBoard directories come from AIP_*, backups are on and
    TF_CPP_MIN_LOG_LEVEL is unset, as a user runs it; no evaluator, so no
    evaluation checkpoints. Shared by the tests of its summary, its saved model,
    its output and its checkpoints (each setting's effect is checked apart).
    """
    root = tmp_path_factory.mktemp("short_run")
    model_dir, logs_dir = root / "aip" / "model", root / "aip" / "logs"
    result = run_task(
        "--strategy=default",
        f"--epochs={SHORT_RUN['epochs']}",
        f"--steps_per_epoch={SHORT_RUN['steps_per_epoch']}",
        f"--global_batch_size={SHORT_RUN['batch']}",
        f"--num_examples={SHORT_RUN['num_examples']}",
        f"--seed={SHORT_RUN['seed']}",
        f"--backup_dir={root / 'backup'}",
        env={
            "AIP_MODEL_DIR": str(model_dir),
            "AIP_TENSORBOARD_LOG_DIR": str(logs_dir),
            "TF_CPP_MIN_LOG_LEVEL": None,
        },
    )
    return result, model_dir, logs_dir


def test_short_run_summary_and_model(short_run):
    result, model_dir, logs_dir = short_run
    epochs, steps_per_epoch = SHORT_RUN["epochs"], SHORT_RUN["steps_per_epoch"]
    batch, num_examples, seed = SHORT_RUN["batch"], SHORT_RUN["num_examples"], SHORT_RUN["seed"]
    assert result.returncode == 0, describe(result)
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["strategy"] == "default"
    assert summary["num_replicas"] == 1
    assert summary["num_workers"] == 1
    assert summary["global_batch_size"] == batch
    assert summary["epochs"] == epochs
    assert summary["steps_completed"] == epochs * steps_per_epoch
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] > 0
    assert summary["final_loss"] == summary["metrics"]["train"]["loss"]
    for split in ("train", "test"):
        assert set(summary["metrics"][split]) >= {"loss", "accuracy"}
        assert 0.0 <= summary["metrics"][split]["accuracy"] <= 1.0
    assert summary["examples_per_second"] > 0
    assert summary["resumed_from_step"] == 0
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed == {key: summary[key] for key in printed}
    assert any(logs_dir.rglob("events.out.tfevents.*")), "AIP_TENSORBOARD_LOG_DIR unused"

    # The saved model is the trained one: it reproduces the reported test loss.
    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True)
    images, labels = datasets_lib.synthetic_arrays(max(num_examples // 8, 1), seed, "test")
    logits = model.predict(images, verbose=0)
    assert logits.shape == (len(images), datasets_lib.SYNTHETIC_NUM_CLASSES)
    assert np.isfinite(logits).all()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    assert float(loss) == pytest.approx(summary["metrics"]["test"]["loss"], rel=1e-4)


STARTUP_BANNERS = (
    "absl::InitializeLog()",
    "oneDNN custom operations are on",
    "Could not find cuda drivers",
    "failed call to cuInit",
)


def test_the_default_output_shows_tfdist_lines_and_no_tensorflow_chatter(short_run):
    # As a user runs it: TF_CPP_MIN_LOG_LEVEL unset, backups on (as on Vertex AI).
    result, _, _ = short_run
    assert result.returncode == 0, describe(result)
    output = result.stdout + result.stderr
    assert "Backed up step 5 to" in output and "Training --model=mlp" in output, describe(result)
    assert "Sharding callback duration" not in output, describe(result)
    # With an NVIDIA device the CUDA lines (the last two) explain a missing GPU and stay.
    has_nvidia_device = os.path.exists(startup_logs.NVIDIA_DEVICE_NODE)
    for banner in STARTUP_BANNERS[:2] if has_nvidia_device else STARTUP_BANNERS:
        assert banner not in output, describe(result)


def test_without_a_model_dir_nothing_is_written(tmp_path):
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    result = run_task("--strategy=default", *SHORT, cwd=workdir)
    assert result.returncode == 0, describe(result)
    assert list(workdir.iterdir()) == []
    assert "not saved" in result.stderr


# --- Bad input: exit 2, one line, no traceback -------------------------------

BEFORE_TENSORFLOW = {
    "unknown optimizer": (["--optimizer=adagrad"], ["--optimizer is 'adagrad'", "lamb"]),
    "unknown strategy": (["--strategy=mirorred"], ["--strategy is 'mirorred'", "multiworker"]),
    "zero epochs": (["--epochs=0"], ["--epochs is 0", "> 0"]),
    "negative epochs": (["--epochs=-3"], ["--epochs is -3"]),
    "zero batch": (["--global_batch_size=0"], ["--global_batch_size is 0"]),
    "negative batch": (["--global_batch_size=-64"], ["--global_batch_size is -64"]),
    "zero learning rate": (["--learning_rate=0"], ["--learning_rate is 0.0"]),
    "negative learning rate": (["--learning_rate=-0.5"], ["--learning_rate is -0.5"]),
    "backup every 0 steps": (["--backup_every_steps=0"], ["backup_every_steps is 0"]),
    "missing config file": (
        ["--config=/nonexistent/exp.json"],
        ["--config file '/nonexistent/exp.json' does not exist"],
    ),
    "stray positional argument": (["--epochs=1", "train"], ["unexpected argument 'train'"]),
    "unknown flag": (["--epoch=3"], ["epoch", "--helpfull"]),
    "non-numeric flag value": (["--epochs=three"], ["three"]),
}


@pytest.mark.parametrize(
    "args, fragments", BEFORE_TENSORFLOW.values(), ids=BEFORE_TENSORFLOW.keys()
)
def test_bad_flags_exit_2_with_one_line(tmp_path, args, fragments):
    result = run_task(*args, f"--model_dir={tmp_path / 'out'}")
    assert_usage_error(result, *fragments)
    assert not (tmp_path / "out").exists()


# Each command's own flag, which its --help lists.
COMMANDS = {
    "trainer.task": "--global_batch_size",
    "trainer.submit": "--job_config",
    "trainer.kubernetes": "--restart_policy",
    "tfdist.launch": "--workers",
    "trainer.ray": "--num_workers",
}


@pytest.mark.parametrize("module, own_flag", COMMANDS.items(), ids=COMMANDS.keys())
def test_help_of_every_command_exits_0_and_lists_its_flags(module, own_flag):
    # absl exits 1 after --help; the four share tfdist.cli.run, which exits 0, and trainer.ray
    # (its own flag set) does the same.
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert own_flag in result.stdout, result.stdout[-2000:]


_CLI_SCRIPT = """
import sys
from tfdist import cli

class Lost(Exception):
    pass

def main(argv, command):
    print(repr(argv[1:]), repr(command), flush=True)
    if command and command[0] == "lose":
        raise Lost("peer gone\\nsecond line")
    if command and command[0] == "crash":
        raise KeyError("not a reported error")

cli.run(main, ["prog", *sys.argv[1:]], takes_command=True,
        exits=[cli.ErrorExit(lambda: (Lost,), cli.EXIT_PEER_LOST, cli.describe_lost_peer)])
"""


@pytest.mark.parametrize(
    "after_dashes, code, error_line",
    [
        (["ok", "--x=1"], 0, None),
        (
            ["lose"],
            200,
            "error: lost contact with another task of the job (Lost: peer gone); "
            "exiting so that the job can restart from its last backup",
        ),
        (["crash"], 1, None),
    ],
)
def test_cli_run_splits_at_dashes_and_reports_each_error_once(after_dashes, code, error_line):
    result = subprocess.run(
        [sys.executable, "-c", _CLI_SCRIPT, "--", *after_dashes],
        cwd=REPO,
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == code, result.stderr[-2000:]
    assert result.stdout.splitlines()[0] == f"[] {tuple(after_dashes)!r}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    if error_line is None:
        assert errors == []
    else:
        assert errors == [error_line] and "Traceback" not in result.stderr
    if code == 1:  # not a reported error: a crash, with its traceback
        assert "KeyError: 'not a reported error'" in result.stderr


SECRET = "s3cr3t-in-the-job-spec"


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        (
            "TF_CONFIG",
            '{"cluster": {"worker": ["localhost:1"]}, "job": "' + SECRET + '"',
            "TF_CONFIG is not valid JSON",
        ),
        (
            "TF_CONFIG",
            json.dumps(
                {
                    "cluster": {"worker": ["localhost"]},
                    "task": {"type": "worker", "index": 0},
                    "job": SECRET,
                }
            ),
            "TF_CONFIG['cluster']['worker'][0] is 'localhost'",
        ),
        (
            "CLUSTER_SPEC",
            json.dumps(
                {
                    "cluster": {"workerpool0": ["h:1", "h:2"]},
                    "task": {"type": "workerpool0", "index": 0},
                    "job": SECRET,
                }
            ),
            "workerpool0'] lists 2 replicas",
        ),
    ],
    ids=["TF_CONFIG not JSON", "address without port", "two primary replicas"],
)
def test_malformed_cluster_variable_exits_2(variable, value, fragment):
    result = run_task(*SHORT, env={variable: value})
    assert_usage_error(result, fragment)
    assert SECRET not in result.stderr


AFTER_TENSORFLOW = {
    "unknown model": (["--model=resnet"], ["--model is 'resnet'", "mlp, cnn"]),
    "unknown dataset": (
        ["--dataset=no_such_dataset_xyz"],
        ["--dataset is 'no_such_dataset_xyz'", "synthetic"],
    ),
    "batch not divisible by replicas": (
        ["--strategy=mirrored", "--num_cpu_devices=3", "--global_batch_size=64"],
        ["--global_batch_size=64 does not divide among 3 replicas", "63 or 66"],
    ),
}
# A parameter-server chief whose peers are ports nobody listens on: a refusal must
# come before any task is contacted.
PARAMETER_SERVER_CHIEF = {
    "TF_CONFIG": json.dumps(
        {
            "cluster": {
                "chief": ["127.0.0.1:7"],
                "worker": ["127.0.0.1:8"],
                "ps": ["127.0.0.1:9"],
            },
            "task": {"type": "chief", "index": 0},
        }
    )
}
REFUSED_UNDER_PARAMETER_SERVERS = {
    "deterministic": ["--strategy=parameter_server", "--deterministic"],
    "xla": ["--strategy=parameter_server", "--jit_compile=true"],
}


@pytest.fixture(scope="module")
def found_after_tensorflow(tmp_path_factory):
    """Each bad input the trainer finds after importing TensorFlow, as its own run.

    The bad inputs of a single process, the refusals of a parameter-server chief,
    and the typos of worker 1 of a 2-worker job whose worker 0 is a socket we
    watch (all runs are stopped at once if one contacts it). The runs are forked
    from one import of TensorFlow (tests/support/forked_runs.py): each is its own
    process with its own exit code and output. Maps a case's name to its result
    and its model directory (for a typo: whether it contacted its worker 0).
    """
    root = tmp_path_factory.mktemp("after_tensorflow")
    typos = {case.id: case.values[0] for case in TYPOS_IN_A_TWO_WORKER_JOB if not case.values[2]}
    listeners = {name: _listen_on_free_port() for name in typos}
    cases = {
        name: ([*args, *SHORT, f"--model_dir={root / str(index) / 'out'}"], {})
        for index, (name, (args, _)) in enumerate(AFTER_TENSORFLOW.items())
    }
    for name, args in REFUSED_UNDER_PARAMETER_SERVERS.items():
        cases[name] = ([*args, *SHORT], PARAMETER_SERVER_CHIEF)
    for name, args in typos.items():
        cases[name] = ([*args, *SHORT], {"TF_CONFIG": _worker_1_of(listeners[name])})
    try:
        results = run_forked_trainers(
            [args for args, _ in cases.values()],
            cwd=REPO,
            env=clean_environ(),
            timeout=TIMEOUT,
            run_envs=[run_env for _, run_env in cases.values()],
            stop_when=lambda: any(_contacted(listener) for listener in listeners.values()),
        )
        found = {
            name: (result, root / str(index) / "out")
            for index, (name, result) in enumerate(zip(cases, results, strict=True))
        }
        found.update({name: (found[name][0], _contacted(listeners[name])) for name in typos})
        return found
    finally:
        for listener in listeners.values():
            listener.close()


@pytest.mark.parametrize("case", AFTER_TENSORFLOW)
def test_bad_input_found_after_importing_tensorflow_exits_2(found_after_tensorflow, case):
    result, model_dir = found_after_tensorflow[case]
    assert_usage_error(result, *AFTER_TENSORFLOW[case][1], only_line=False)
    assert not model_dir.exists()


# --- A typo never turns into a hang ------------------------------------------


def _listen_on_free_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


TYPOS_IN_A_TWO_WORKER_JOB = [
    pytest.param(
        ["--strategy=multiwroker"], ["--strategy is 'multiwroker'"], True, id="typo'd strategy"
    ),
    pytest.param(
        ["--strategy=multiworker", "--global_batch_size=63"],
        ["does not divide among 2 replicas"],
        False,
        id="batch not divisible by 2 workers",
    ),
    pytest.param(
        ["--strategy=multiworker", "--model=mpl"], ["--model is 'mpl'"], False, id="typo'd model"
    ),
    pytest.param(
        ["--strategy=multiworker", "--dataset=mnits"],
        ["--dataset is 'mnits'"],
        False,
        id="typo'd dataset",
    ),
    pytest.param(
        ["--strategy=multiworker", "--optimizer=lars", "--momentum=1.0"],
        ["--optimizer=lars: --momentum is 1.0, expected a number in [0, 1)"],
        True,
        id="lars momentum 1",
    ),
    pytest.param(
        ["--strategy=multiworker", "--optimizer=sgd", "--momentum=1.5"],
        ["--optimizer=sgd: --momentum is 1.5, expected a number in [0, 1]"],
        True,
        id="sgd momentum above 1",
    ),
]


def _worker_1_of(listener: socket.socket) -> str:
    """TF_CONFIG of worker 1 of a 2-worker job whose worker 0 is `listener`."""
    peer_port = listener.getsockname()[1]
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{peer_port}", f"127.0.0.1:{_free_port()}"]},
            "task": {"type": "worker", "index": 1},
        }
    )


def _contacted(listener: socket.socket) -> bool:
    return bool(select.select([listener], [], [], 0)[0])


@pytest.mark.parametrize("args, fragments, only_line", TYPOS_IN_A_TWO_WORKER_JOB)
def test_bad_input_fails_before_contacting_any_peer(request, args, fragments, only_line):
    """Worker 1 of a 2-worker job whose worker 0 is a socket we watch.

    MultiWorkerMirroredStrategy's worker 1 connects to worker 0 (the
    coordination service) as soon as the strategy is built. A connection on
    our socket proves the task reached a peer before rejecting its input; we
    then stop it at once instead of waiting for a hang. The typos found after
    importing TensorFlow run together (`found_after_tensorflow`); those
    found before it run as a process each, whose stderr must be the error line.
    """
    if not only_line:
        result, contacted = request.getfixturevalue("found_after_tensorflow")[
            request.node.callspec.id
        ]
        assert not contacted, f"the task connected to worker 0 before failing\n{describe(result)}"
        assert_usage_error(result, *fragments, only_line=False)
        return
    listener = _listen_on_free_port()
    process = subprocess.Popen(
        trainer_command(*args, *SHORT),
        cwd=REPO,
        env=clean_environ({"TF_CONFIG": _worker_1_of(listener)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    contacted = False
    try:
        deadline = time.monotonic() + TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            readable, _, _ = select.select([listener], [], [], 0.2)
            if readable:
                contacted = True
                break
    finally:
        if process.poll() is None:
            process.kill()
        stdout, stderr = process.communicate(timeout=60)
        listener.close()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert not contacted, f"the task connected to worker 0 before failing\n{describe(result)}"
    assert_usage_error(result, *fragments, only_line=only_line)


def test_evaluation_checkpoints_only_for_an_evaluator_and_only_the_newest_few(short_run, tmp_path):
    # Without an evaluator nothing reads them: none are written (the short run has none).
    # Asked for: one per epoch, the newest 3 kept, the done marker names the last.
    without, plain, _ = short_run
    assert without.returncode == 0, describe(without)
    assert not (plain / "checkpoints").exists()
    assert (plain / "summary.json").exists()

    exported = tmp_path / "exported"
    with_checkpoints = run_task(
        "--strategy=default",
        "--epochs=5",
        "--steps_per_epoch=2",
        "--num_examples=256",
        "--evaluation_checkpoints",
        PINNED_EXECUTION,
        f"--model_dir={exported}",
    )
    assert with_checkpoints.returncode == 0, describe(with_checkpoints)
    indexes = sorted(
        {path.name.split(".")[0] for path in (exported / "checkpoints").glob("ckpt-*.index")}
    )
    assert indexes == ["ckpt-10", "ckpt-6", "ckpt-8"]
    done = json.loads((exported / "checkpoints" / "training_done.json").read_text())
    assert done == {"last_checkpoint": "ckpt-10", "step": 10}


def test_deterministic_parameter_server_training_is_refused_before_any_peer(
    found_after_tensorflow,
):
    result, _ = found_after_tensorflow["deterministic"]
    assert_usage_error(
        result, "--deterministic was given with parameter-server training", only_line=False
    )


def test_xla_under_mirrored_matches_the_run_without_it(tmp_path):
    weights = {}
    settings = ("true", "false")
    results = run_tasks_side_by_side(
        *(
            [
                "--strategy=mirrored",
                "--num_cpu_devices=2",
                "--epochs=1",
                "--steps_per_epoch=10",
                "--num_examples=512",
                "--deterministic",
                PINNED_EXECUTION,
                f"--jit_compile={setting}",
                f"--model_dir={tmp_path / setting}",
            ]
            for setting in settings
        )
    )
    for setting, result in zip(settings, results, strict=True):
        out = tmp_path / setting
        assert result.returncode == 0, describe(result)
        assert f"XLA {'on' if setting == 'true' else 'off'}: --jit_compile={setting}" in (
            result.stderr
        )
        weights[setting] = keras.saving.load_model(
            out / "model.keras", safe_mode=True, compile=False
        ).get_weights()
    for with_xla, without in zip(weights["true"], weights["false"], strict=True):
        np.testing.assert_allclose(with_xla, without, rtol=0, atol=1e-5)


def test_xla_under_parameter_servers_is_refused_before_any_peer(found_after_tensorflow):
    result, _ = found_after_tensorflow["xla"]
    assert_usage_error(
        result, "--jit_compile=true was given with parameter-server training", only_line=False
    )
