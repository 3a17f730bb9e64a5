"""Runs `python -m trainer.task ARGS` once per argument list, each in its own forked process.

    python tests/jobs/forked_trainer_runs.py --runs=RUNS.json --out=DIR --timeout=SECONDS

`RUNS.json` is a list of runs, each `{"args": [...], "env": {...}}`: the
arguments, and the variables to set (a null value: to unset) in that child's
environment, which is otherwise this parent's. This parent imports TensorFlow (as the
trainer does, without its start-up banners), Keras and `trainer.run` once, most
of the CPU of a run that fails before training, and then forks one child per
run before TensorFlow's runtime has started (it checks). Each child runs the
trainer's entry point as `python -m trainer.task ARGS` would, from the parent's
working directory, with its stdout and stderr in `DIR/<i>.stdout` and
`DIR/<i>.stderr`; its exit code (negative: killed by that signal, as
`subprocess` reports it) goes to `DIR/codes.json`. A child still running after
`--timeout` seconds is killed.

For tests of mistakes that the trainer reports before it trains; a run that
trains belongs in a process of its own.
"""

import argparse
import json
import os
import pathlib
import runpy
import signal
import sys
import traceback


def _parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    return parser.parse_args()


def _exit_code(code) -> int:
    """The exit code the interpreter gives `SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def _child(run: dict, out: pathlib.Path, index: int) -> None:
    """Becomes `python -m trainer.task *args` in its environment; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        for key, value in run["env"].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, suffix in ((1, "stdout"), (2, "stderr")):
            target = os.open(out / f"{index}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        sys.argv = ["-m", *run["args"]]  # run_module replaces argv[0] with the module's file
        runpy.run_module("trainer.task", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:  # pylint: disable=broad-except  (as the interpreter reports it)
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    options = _parse_args()
    runs = json.loads(pathlib.Path(options.runs).read_text())
    out = pathlib.Path(options.out)
    out.mkdir(parents=True, exist_ok=True)

    from tfdist._internal import startup_logs  # pylint: disable=g-import-not-at-top

    startup_logs.import_tensorflow_quietly()
    import keras  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    import trainer.run  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top

    # trainer.task defines its flags when imported: each child imports it afresh.
    assert "trainer.task" not in sys.modules
    # A child must start TensorFlow's runtime itself, as a fresh process does.
    assert not keras_compat.runtime_initialized()

    children = []
    for index, run in enumerate(runs):
        pid = os.fork()
        if pid == 0:
            _child(run, out, index)
        children.append(pid)

    def kill_all(signum, frame):  # pylint: disable=unused-argument
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGALRM, kill_all)
    signal.alarm(max(1, int(options.timeout)))
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    signal.alarm(0)
    (out / "codes.json").write_text(json.dumps(codes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
