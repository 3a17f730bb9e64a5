"""Mixed precision in the trainer: train, save, reload and resume exactly.

`mixed_float16` must train with dynamic loss scaling (Keras 3 wraps the
optimizer in `LossScaleOptimizer` when the policy is mixed_float16), LARS and
LAMB included, on one process and on 2 workers; `mixed_bfloat16` needs no
loss scaling. A preempted run resumed from its backup must end with the
weights *and optimizer state* (loss scale and its counter included) of an
uninterrupted run.
"""

import json
import pathlib
import signal
import sys

import keras
import numpy as np
import pytest

from tests.support.backup_files import committed_steps
from tests.support.logged_process import finish, log_tail, start_logged
from tfdist.cli import EXIT_PREEMPTED
from tfdist.launch.testing import poll_until

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 600
EPOCHS, STEPS_PER_EPOCH = 2, 40
# The preempted run trains 230 steps after its first backup (about 0.65 s here): room
# for the SIGTERM that follows that backup to land before training ends.
PREEMPTED_STEPS_PER_EPOCH = 120


def _flags(policy: str, optimizer: str, steps_per_epoch: int = STEPS_PER_EPOCH) -> list[str]:
    learning_rate = {"lars": "1.0", "lamb": "0.002", "sgd": "0.05"}[optimizer]
    return [
        "--model=mlp",
        "--dataset=synthetic",
        "--num_examples=1024",
        f"--epochs={EPOCHS}",
        f"--steps_per_epoch={steps_per_epoch}",
        "--global_batch_size=32",
        "--backup_every_steps=10",
        "--deterministic",
        "--seed=4",
        f"--mixed_precision={policy}",
        f"--optimizer={optimizer}",
        f"--learning_rate={learning_rate}",
    ]


def _start(tmp_path, name, *flags):
    out = tmp_path / name
    out.mkdir()
    return start_logged(
        [sys.executable, "-m", "trainer.task", *flags, f"--model_dir={out}"], out, cwd=REPO
    )


def _run(tmp_path, name, *flags):
    process = _start(tmp_path, name, *flags)
    code = finish(process, TIMEOUT)
    assert code == 0, f"{name} exited {code}:\n{log_tail(process)}"
    return process


def _saved(out: pathlib.Path, policy: str, steps: int = EPOCHS * STEPS_PER_EPOCH):
    """The saved model, its weights and optimizer variables, loaded under `policy`.

    Keras decides whether to wrap the optimizer in a LossScaleOptimizer from the
    *global* policy at load time: loaded under float32, a mixed_float16 model's
    optimizer state is skipped ("Skipping variable loading for optimizer").
    """
    # Its first use registers tfdist>LARS, tfdist>LAMB and tfdist>WarmupDecay with Keras.
    from tfdist.optimizers import LARS  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert int(model.optimizer.iterations.numpy()) == steps
    return (
        model,
        [np.asarray(w) for w in model.get_weights()],
        {v.path: np.asarray(v) for v in model.optimizer.variables},
    )


@pytest.mark.parametrize(
    "policy,optimizer", [("mixed_float16", "lars"), ("mixed_bfloat16", "lamb")]
)
def test_a_preempted_mixed_precision_run_resumes_exactly(tmp_path, policy, optimizer):
    # Not a test of `steps_per_execution=auto`: a fixed value spares each of the three
    # processes auto's probing, and the resume is exact for any value.
    flags = [*_flags(policy, optimizer, PREEMPTED_STEPS_PER_EPOCH), "--steps_per_execution=1"]
    total = EPOCHS * PREEMPTED_STEPS_PER_EPOCH
    # The uninterrupted reference runs beside the run to preempt (one process each):
    # they share nothing but the flags.
    reference = _start(tmp_path, "reference", *flags, f"--backup_dir={tmp_path / 'ref-backup'}")
    backup_dir = tmp_path / "backup"
    victim = _start(tmp_path, "preempted", *flags, f"--backup_dir={backup_dir}")
    try:
        poll_until(
            lambda: committed_steps(backup_dir) or victim.poll() is not None,
            timeout=TIMEOUT,
            what="the first backup",
        )
        assert victim.poll() is None, log_tail(victim)
        victim.send_signal(signal.SIGTERM)
        code = finish(victim, 120)
        reference_code = finish(reference, TIMEOUT)
    finally:
        finish(victim, 1)
        finish(reference, 1)
    assert code == EXIT_PREEMPTED, log_tail(victim)
    assert reference_code == 0, f"reference exited {reference_code}:\n{log_tail(reference)}"
    resumed = _run(tmp_path, "resumed", *flags, f"--backup_dir={backup_dir}")

    summary = json.loads((resumed.out / "summary.json").read_text())
    assert 0 < summary["resumed_from_step"] < total
    assert summary["steps_completed"] == total
    assert np.isfinite(summary["final_loss"])
    model, want_weights, want_slots = _saved(reference.out, policy, total)
    _, got_weights, got_slots = _saved(resumed.out, policy, total)
    assert model.layers[1].dtype_policy.name == policy  # the hidden Dense; logits stay float32
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    if scaled:
        assert any("dynamic_scale" in path for path in want_slots), sorted(want_slots)
    for want, got in zip(want_weights, got_weights, strict=True):
        np.testing.assert_array_equal(got, want)
    assert sorted(got_slots) == sorted(want_slots)
    for path, want in want_slots.items():
        np.testing.assert_array_equal(got_slots[path], want, err_msg=path)


def test_two_workers_train_mixed_float16_with_lamb_like_one_process(local_cluster, tmp_path):
    common = ["-m", "trainer.task", *_flags("mixed_float16", "lamb")]
    # The one-process run goes beside the cluster: they share nothing but the flags.
    one = _start(tmp_path, "one", *common[2:], "--strategy=mirrored", "--num_cpu_devices=2")
    try:
        cluster = local_cluster(
            num_workers=2,
            env={"TF_CPP_MIN_LOG_LEVEL": "2"},
            command=[
                sys.executable,
                *common,
                "--strategy=multiworker",
                f"--model_dir={tmp_path / 'two'}",
            ],
        )
        cluster.start()
        codes = cluster.wait(timeout=TIMEOUT)
        assert set(codes.values()) == {0}, cluster.format_logs()
        one_code = finish(one, TIMEOUT)
    finally:
        finish(one, 1)
    assert one_code == 0, f"one exited {one_code}:\n{log_tail(one)}"

    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (summary["num_workers"], summary["steps_completed"]) == (2, EPOCHS * STEPS_PER_EPOCH)
    assert np.isfinite(summary["final_loss"])
    _, one_weights, one_slots = _saved(one.out, "mixed_float16")
    model, two_weights, two_slots = _saved(tmp_path / "two", "mixed_float16")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert type(model.optimizer.inner_optimizer).__name__ == "LAMB"
    # Same replica count, same global batch: the same float16 arithmetic (GUIDE: compare
    # Adam-like optimizers against the same number of replicas).
    for want, got in zip(one_weights, two_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    for path in one_slots:
        if "dynamic_scale" in path or "step_counter" in path:
            np.testing.assert_array_equal(two_slots[path], one_slots[path], err_msg=path)
