"""LAMB against the issue's update rule, written here in float64 NumPy."""

from tests.multiprocess.test_optimizers_lars import run_mirrored


def test_mirrored_two_cpus_matches_single_device():
    result = run_mirrored("lars", "lamb")
    assert result["replicas"] == 2
    assert result["lamb"]["steps"] == [8, 8]
    assert result["lamb"]["moved"] > 1e-3
    assert result["lamb"]["max_diff"] < 1e-5, result
