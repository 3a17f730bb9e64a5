"""Runs an example script unchanged, as `python SCRIPT ARGS...` would, with a fault put in.

    python tests/jobs/example_run.py [--kill_after_batches=N] [--fit_override=JSON]
        [--history=PATH] SCRIPT ARGS...

`--kill_after_batches=N` SIGKILLs the process after N batches of this run
(tests/support/fault_injection.py, first among the callbacks); `--fit_override`
replaces arguments of the script's `tfdist.resumable.fit` call (a restart with
other settings); `--history` writes the `History` that `fit` returned to PATH as JSON
(the chief's: `tfdist.resumable.write_path`). Only `tfdist.resumable.fit` is wrapped: the script's code runs as it is.
"""

import json
import pathlib
import runpy
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import tfdist.resumable  # noqa: E402  pylint: disable=wrong-import-position
from tests.support.fault_injection import KillAfterBatches  # noqa: E402  pylint: disable=wrong-import-position


def main(argv: list[str]) -> None:
    kill_after, override, history_path = 0, {}, ""
    while argv and argv[0].startswith("--"):
        name, _, value = argv.pop(0).partition("=")
        if name == "--kill_after_batches":
            kill_after = int(value)
        elif name == "--fit_override":
            override = json.loads(value)
        elif name == "--history":
            history_path = value
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
        return history

    tfdist.resumable.fit = faulty_fit
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
