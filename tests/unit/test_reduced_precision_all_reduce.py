"""`set_gradient_all_reduce_dtype`: gradients summed across replicas in bfloat16.

Upstream Keras 3 all-reduces gradients in their own dtype with no option to
narrow them; the job script takes one SGD step on 2 replicas whose gradient
(1 + 2**-10) is exact in float32 and not in bfloat16.
"""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "reduced_precision_step.py"


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
