"""Parameter-server training throughput against one process, on the same job.

Runs `python -m trainer.task` on one job (model, data, global batch, steps) as:

- `default`: one process, Keras `fit`;
- `ps-1w`: `--strategy=parameter_server` with chief + 1 worker + 1 ps;
- `ps-2w`: the same with 2 workers;

each launched with `python -m tfdist.launch`, in alternating rounds, and reads
`examples_per_second` from each run's `summary.json` (steady-state: the first
sync point, which includes tracing, is left out). Prints a markdown table of
medians and the ratios to `default`.

    python bench/bench_parameter_server.py                 # mlp, ~4 min on 2 CPUs
    python bench/bench_parameter_server.py --model=cnn --rounds=3
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = {
    "default": {"strategy": "default", "launch": None},
    "ps-1w": {"strategy": "parameter_server", "launch": ["--chief", "--workers", "1", "--ps", "1"]},
    "ps-2w": {"strategy": "parameter_server", "launch": ["--chief", "--workers", "2", "--ps", "1"]},
}


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    return parser.parse_args()


def _run(name: str, args, work: pathlib.Path) -> float:
    config = CONFIGS[name]
    model_dir = work / name
    task = [
        sys.executable,
        "-m",
        "trainer.task",
        f"--strategy={config['strategy']}",
        f"--model={args.model}",
        f"--global_batch_size={args.global_batch_size}",
        f"--epochs={args.epochs}",
        f"--steps_per_epoch={args.steps_per_epoch}",
        f"--model_dir={model_dir}",
    ]
    if config["launch"]:
        command = [
            sys.executable,
            "-m",
            "tfdist.launch",
            *config["launch"],
            "--quiet",
            f"--timeout={args.timeout}",
            "--",
            *task,
        ]
    else:
        command = task
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    env.pop("CLUSTER_SPEC", None)
    result = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout + 60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name} exited {result.returncode}:\n{result.stderr[-3000:]}")
    summary = json.loads((model_dir / "summary.json").read_text())
    expected = args.epochs * args.steps_per_epoch
    if summary["steps_completed"] != expected:
        raise RuntimeError(
            f"{name} applied {summary['steps_completed']} steps, expected {expected}"
        )
    return float(summary["examples_per_second"])


def main() -> None:
    args = _parse_args()
    samples = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bench-ps-") as tmp:
        for round_index in range(args.rounds):
            for name in CONFIGS:
                work = pathlib.Path(tmp) / f"round{round_index}"
                value = _run(name, args, work)
                samples[name].append(value)
                print(f"round {round_index + 1}: {name}: {value:.0f} examples/s", flush=True)
    baseline = statistics.median(samples["default"])
    print(
        f"\n{args.model}, global batch {args.global_batch_size}, "
        f"{args.epochs}x{args.steps_per_epoch} steps, median of {args.rounds} rounds\n"
    )
    print("| run | examples/s | vs default |")
    print("|---|---:|---:|")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.0f} | {median / baseline:.2f}x |")


if __name__ == "__main__":
    main()
