"""Runs an example script unchanged, as `python SCRIPT ARGS...` would, with a fault put in.

    python tests/jobs/example_run.py [--kill_after_batches=N] [--fit_override=JSON]
        [--history=PATH] [--state=DIR] [--chief_lingers=SECONDS] SCRIPT ARGS...

`--kill_after_batches=N` SIGKILLs the process after N batches of this run
(tests/support/fault_injection.py, first among the callbacks); `--fit_override`
replaces arguments of the script's `tfdist.resumable.fit` call (a restart with
other settings); `--history` writes the `History` that `fit` returned to PATH as JSON
(the chief's: `tfdist.resumable.write_path`); `--state` writes every variable of the
model and of the optimizers it holds, their iterations and the history to DIR
(tests/support/model_state.py); `--chief_lingers` keeps the chief's process that long
after the script ends (a chief that writes large outputs), past TensorFlow's 10 s
heartbeat timeout. Only `tfdist.resumable.fit` is wrapped: the script's code runs as it
is, its own directory first on `sys.path` as under `python SCRIPT`.
"""

import json
import os
import pathlib
import runpy
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import tfdist.resumable  # noqa: E402  pylint: disable=wrong-import-position
from tests.support import model_state  # noqa: E402  pylint: disable=wrong-import-position
from tests.support.fault_injection import KillAfterBatches  # noqa: E402  pylint: disable=wrong-import-position


def main(argv: list[str]) -> None:
    kill_after, override, history_path, state_dir, linger = 0, {}, "", "", 0.0
    while argv and argv[0].startswith("--"):
        name, _, value = argv.pop(0).partition("=")
        if name == "--kill_after_batches":
            kill_after = int(value)
        elif name == "--fit_override":
            override = json.loads(value)
        elif name == "--history":
            history_path = value
        elif name == "--state":
            state_dir = value
        elif name == "--chief_lingers":
            linger = float(value)
        else:
            raise SystemExit(f"unknown flag {name}")
    fit = tfdist.resumable.fit

    def faulty_fit(*args, **kwargs):
        kwargs.update(override)
        if kill_after:
            kwargs["callbacks"] = [KillAfterBatches(kill_after), *(kwargs.get("callbacks") or [])]
        history = fit(*args, **kwargs)
        if history_path:
            path = tfdist.resumable.write_path(history_path)
            pathlib.Path(path).write_text(json.dumps(history.history))
        if state_dir:
            model_state.write(kwargs["model"] if "model" in kwargs else args[0], history, state_dir)
        return history

    tfdist.resumable.fit = faulty_fit
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")
    chief = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0) == 0
    if chief:
        time.sleep(linger)


if __name__ == "__main__":
    main(sys.argv[1:])
