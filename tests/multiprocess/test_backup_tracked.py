"""keras.io's GAN on `tfdist.resumable.fit`, killed with SIGKILL after a committed backup and
resumed, ends bit for bit where the uninterrupted run ends: its weights, both of its own
optimizers (their iterations and slots), its seed generator. One process here; two
workers in the suite's one 2-worker GAN run, examples/gan_script/after.py killed and
resumed (tests/multiprocess/test_upgraded_scripts.py), which asserts the same.

The in-process half (a raised crash, the keys, the refusals) is
tests/unit/test_backup_tracked.py.
"""

import pathlib
import signal
import sys

from tests.jobs import gan_script
from tests.support import model_state
from tests.support.logged_process import finish, log_tail, start_logged

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "jobs" / "gan_script.py"
TIMEOUT = 240
# Backups every 3 steps: killed after step 7, the job resumes from step 6, mid-epoch 1.
KILL_AFTER = 7


def _run(out: pathlib.Path, *flags: str) -> tuple[int, str]:
    process = start_logged([sys.executable, str(SCRIPT), str(out), *flags], out, cwd=REPO)
    return finish(process, timeout=TIMEOUT), log_tail(process)


def test_one_process_killed_after_a_backup_resumes_bit_for_bit(tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    out.mkdir()
    gan_script.run(reference)  # in this process: one TensorFlow start-up less
    code, log = _run(out, f"--kill_after_batches={KILL_AFTER}")
    assert code == -signal.SIGKILL, log
    assert not (out / "result.json").exists()
    code, log = _run(out)
    assert code == 0, log
    steps = gan_script.EPOCHS * gan_script.STEPS_PER_EPOCH
    model_state.assert_same_end(
        out, reference, steps=steps, optimizers=("d_optimizer", "g_optimizer")
    )
