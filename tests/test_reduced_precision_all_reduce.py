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

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "reduced_precision_step.py"


def _step(*flags: str) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("TF_CONFIG", "CLUSTER_SPEC")}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, str(JOB), *flags], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_upstream_sums_in_float32_and_bfloat16_rounds_the_sum():
    upstream = _step()
    narrowed = _step("--all_reduce_dtype=bfloat16")
    assert upstream["replicas"] == narrowed["replicas"] == 2
    assert upstream["weight"] == pytest.approx(1 + 2**-10, abs=1e-7)  # float32 kept 2**-10
    assert narrowed["weight"] == 1.0  # each replica's gradient was rounded to bfloat16


def test_float32_restores_keras_and_bad_dtypes_are_refused():
    sys.path.insert(0, str(JOB.parent))
    try:
        import reduced_precision_step  # pylint: disable=g-import-not-at-top,import-error
    finally:
        sys.path.pop(0)
    import keras  # pylint: disable=g-import-not-at-top

    module = reduced_precision_step.reduced_precision_module()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    module.set_gradient_all_reduce_dtype(optimizer, "bfloat16")
    assert module.gradient_all_reduce_dtype(optimizer) == "bfloat16"
    assert "_all_reduce_sum_gradients" in vars(optimizer.inner_optimizer)
    module.set_gradient_all_reduce_dtype(optimizer, "float32")
    assert module.gradient_all_reduce_dtype(optimizer) == "float32"
    assert "_all_reduce_sum_gradients" not in vars(optimizer.inner_optimizer)
    with pytest.raises(ValueError, match="'int8' is not supported"):
        module.set_gradient_all_reduce_dtype(optimizer, "int8")
