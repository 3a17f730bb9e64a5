"""`set_gradient_all_reduce_dtype`: gradients summed across replicas in bfloat16.

Upstream Keras 3 all-reduces gradients in their own dtype with no option to
narrow them; the job script takes one SGD step on 2 replicas whose gradient
(1 + 2**-10) is exact in float32 and not in bfloat16, once with Keras's own
all-reduce and once in bfloat16, in one process.
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
    # One process, two models: Keras's own all-reduce first, then the narrowed one.
    result = _step("--all_reduce_dtype=bfloat16")
    assert result["replicas"] == 2
    upstream, narrowed = result["weight"]["keras"], result["weight"]["bfloat16"]
    assert upstream == pytest.approx(1 + 2**-10, abs=1e-7)  # float32 kept 2**-10
    assert narrowed == 1.0  # each replica's gradient was rounded to bfloat16
