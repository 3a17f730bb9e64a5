"""tfdist.keras_compat in one process: each upstream Keras bug still exists, and the corrections.

`tests/jobs/keras_compat_job.py` runs in a fresh process (it splits the CPU into 2
logical devices) and trains small models under MirroredStrategy with the
corrections removed, then applied. When an `upstream` test fails, Keras fixed
that bug: raise `keras_compat.FIRST_FIXED_KERAS` and retire the correction.
The multi-worker upstream failures are in `tests/multiprocess/test_multiworker.py`.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "keras_compat_job.py"
# XLA on CPU: the corrected runs match the reference to float32 round-off.
XLA_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    if not keras_compat.needs_patch():
        pytest.skip(f"keras {keras_compat.keras_version()} is not patched")
    out = tmp_path_factory.mktemp("keras_compat")
    env = {
        key: value for key, value in os.environ.items() if key not in ("TF_CONFIG", "CLUSTER_SPEC")
    }
    env.update(
        PYTHONPATH=str(ROOT),
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
        XLA_FLAGS=f"--xla_dump_to={out / 'xla'}",
    )
    result = subprocess.run(
        [sys.executable, str(JOB), f"--out={out}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text())


def _weights(path: pathlib.Path) -> list[np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


def _max_difference(out: pathlib.Path, left: str, right: str) -> float:
    return max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(_weights(out / f"{left}.npz"), _weights(out / f"{right}.npz"))
    )


def test_upstream_jit_compile_under_mirrored_still_fails(job):
    _, results = job
    error = results["upstream"]["jit_compile"]
    assert error is not None and "Trying to access resource" in error, error


def test_upstream_steps_per_execution_under_collective_mirrored_still_fails(job):
    _, results = job
    error = results["upstream"]["steps_per_execution"]
    assert error is not None and "You must feed a value for placeholder tensor" in error, error


def test_fused_steps_per_execution_equals_single_steps(job):
    out, results = job
    assert results["applied"] is True
    assert _max_difference(out, "mlp_reference", "mlp_fused") == 0.0
    reference = results["runs"]["mlp_reference"]["batch_logs"]
    fused = results["runs"]["mlp_fused"]["batch_logs"]
    assert [log["batch"] for log in fused] == [3, 7]
    assert fused == [reference[3], reference[7]]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_replica_xla_matches_the_run_without_xla(job, model):
    """`jit_compile=True` under MirroredStrategy: within float32 round-off of no XLA."""
    out, results = job
    assert _max_difference(out, f"{model}_reference", f"{model}_xla") < XLA_TOLERANCE
    reference, xla = results["runs"][f"{model}_reference"], results["runs"][f"{model}_xla"]
    assert xla["batch_logs"][-1] == pytest.approx(reference["batch_logs"][-1], rel=XLA_TOLERANCE)
    assert xla["evaluate"] == pytest.approx(reference["evaluate"], rel=XLA_TOLERANCE)


def test_replica_xla_really_compiles_each_replica_step(job):
    out, _ = job
    compiled = {
        path.name.split(".")[1]
        for path in (out / "xla").iterdir()
        if path.name.startswith("module_")
    }
    assert any("_stateless" in name for name in compiled), sorted(compiled)[:10]
