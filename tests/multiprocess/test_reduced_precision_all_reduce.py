"""`set_gradient_all_reduce_dtype`: gradients summed across replicas in bfloat16.

Upstream Keras 3 all-reduces gradients in their own dtype with no option to
narrow them; the job script takes one SGD step on 2 replicas whose gradient
(1 + 2**-10) is exact in float32 and not in bfloat16.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "reduced_precision_step.py"


def _step(*flags: str) -> dict:
    env = {
        key: value for key, value in os.environ.items() if key not in ("TF_CONFIG", "CLUSTER_SPEC")
    }
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, str(JOB), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_upstream_sums_in_float32_and_bfloat16_rounds_the_sum():
    upstream = _step()
    narrowed = _step("--all_reduce_dtype=bfloat16")
    assert upstream["replicas"] == narrowed["replicas"] == 2
    assert upstream["weight"] == pytest.approx(1 + 2**-10, abs=1e-7)  # float32 kept 2**-10
    assert narrowed["weight"] == 1.0  # each replica's gradient was rounded to bfloat16
