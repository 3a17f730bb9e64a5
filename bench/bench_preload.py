"""CPU of a local 2-worker job with fresh tasks vs tasks forked from a preload server.

    python bench/bench_preload.py --rounds=3

Each round runs the same `python -m tfdist.launch --workers 2 -- python -m
trainer.task --strategy=multiworker ...` job twice, side by side in time
(fresh, then with `TFDIST_LAUNCH_PRELOAD=tensorflow`), and counts the CPU
seconds (user + system) of the launcher and everything it started, read from
`getrusage(RUSAGE_CHILDREN)` once the launcher has exited. It also checks
that both jobs end with the same weights. Results: docs/benchmarks.md.
"""

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile

import two_workers

REPO = pathlib.Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(out: pathlib.Path, preload: str, steps: int) -> float:
    """Runs the job once; returns its CPU seconds."""
    env = {
        **two_workers.child_environ(),
        "CUDA_VISIBLE_DEVICES": "",
        "TFDIST_LAUNCH_PRELOAD": preload,
    }
    command = [
        sys.executable,
        "-m",
        "tfdist.launch",
        "--workers=2",
        "--quiet",
        f"--log_dir={out / 'logs'}",
        "--",
        sys.executable,
        "-m",
        "trainer.task",
        "--strategy=multiworker",
        "--model=mlp",
        "--dataset=synthetic",
        "--num_examples=512",
        "--epochs=1",
        f"--steps_per_epoch={steps}",
        "--global_batch_size=32",
        "--steps_per_execution=1",
        "--seed=1",
        f"--model_dir={out / 'model'}",
    ]
    before = _children_cpu()
    completed = subprocess.run(command, env=env, cwd=REPO, capture_output=True, timeout=600)
    if completed.returncode != 0:
        raise SystemExit(f"the job exited {completed.returncode}:\n{completed.stderr[-3000:]}")
    return _children_cpu() - before


def _max_difference(left: pathlib.Path, right: pathlib.Path) -> float:
    import keras  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top

    def weights(model_dir):
        model = keras.saving.load_model(
            model_dir / "model" / "model.keras", safe_mode=True, compile=False
        )
        return model.get_weights()

    return max(
        float(np.max(np.abs(a - b))) for a, b in zip(weights(left), weights(right), strict=True)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default="")
    options = parser.parse_args()
    fresh, forked, differences = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch)
        for index in range(options.rounds):
            fresh.append(run_job(root / f"fresh{index}", "", options.steps))
            forked.append(run_job(root / f"forked{index}", "tensorflow", options.steps))
            differences.append(_max_difference(root / f"fresh{index}", root / f"forked{index}"))
            print(
                f"round {index + 1}: fresh {fresh[-1]:.2f} s, preloaded {forked[-1]:.2f} s of CPU, "
                f"max |weight difference| {differences[-1]:g}",
                flush=True,
            )
    result = {
        "fresh_cpu_seconds": statistics.median(fresh),
        "preloaded_cpu_seconds": statistics.median(forked),
        "ratio": statistics.median(forked) / statistics.median(fresh),
        "max_weight_difference": max(differences),
        "rounds": options.rounds,
        "steps": options.steps,
    }
    print(json.dumps(result))
    if options.json:
        pathlib.Path(options.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
