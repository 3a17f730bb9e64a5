"""Parameter-server training throughput against one process, on the same job.

Runs `python -m trainer.task` on one job (model, data, global batch, steps) as:

- `default`: one process, Keras `fit`;
- `ps-1w`: `--strategy=parameter_server` with chief + 1 worker + 1 ps;
- `ps-2w`: the same with 2 workers;
- `ps-2w-spe1`, `ps-2w-spe10`: 2 workers at a fixed `--steps_per_execution`
  (`ps-2w` runs the default, `auto`);
- `tf_keras-2w-spe1`, `tf_keras-2w-spe10`: the TensorFlow tutorial's job in
  tf_keras (`bench/ps_tf_keras_job.py`: tf_keras's own `fit` on the same model
  and data) on the same cluster, at 1 and 10 steps per execution;

each launched with `python -m tfdist.launch`, in alternating rounds, and reads
`examples_per_second` from each run's `summary.json` (steady-state: the first
sync point, which includes tracing, is left out). Prints a markdown table of
medians and the ratios to `default`.

    python bench/bench_parameter_server.py                 # mlp, ~4 min on 2 CPUs
    python bench/bench_parameter_server.py --model=cnn --rounds=3
    python bench/bench_parameter_server.py --rounds=3 \
        --configs=ps-2w-spe1,ps-2w,tf_keras-2w-spe1,tf_keras-2w-spe10   # auto vs tf_keras
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
_PS_1W = ["--chief", "--workers", "1", "--ps", "1"]
_PS_2W = ["--chief", "--workers", "2", "--ps", "1"]
CONFIGS = {
    "default": {"strategy": "default", "launch": None},
    "ps-1w": {"strategy": "parameter_server", "launch": _PS_1W},
    "ps-2w": {"strategy": "parameter_server", "launch": _PS_2W},
    "ps-2w-spe1": {"strategy": "parameter_server", "launch": _PS_2W, "spe": 1},
    "ps-2w-spe10": {"strategy": "parameter_server", "launch": _PS_2W, "spe": 10},
    "ps-2w-spe50": {"strategy": "parameter_server", "launch": _PS_2W, "spe": 50},
    "tf_keras-2w-spe1": {"peer": True, "launch": _PS_2W, "spe": 1},
    "tf_keras-2w-spe10": {"peer": True, "launch": _PS_2W, "spe": 10},
}
DEFAULT_CONFIGS = "default,ps-1w,ps-2w"


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_epoch", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help=f"Comma-separated, of: {', '.join(CONFIGS)}"
    )
    return parser.parse_args()


def _run(name: str, args, work: pathlib.Path) -> float:
    config = CONFIGS[name]
    model_dir = work / name
    if config.get("peer"):
        task = [
            sys.executable,
            str(REPO / "bench" / "ps_tf_keras_job.py"),
            f"--out={model_dir}",
            f"--steps_per_execution={config['spe']}",
        ]
    else:
        task = [
            sys.executable,
            "-m",
            "trainer.task",
            f"--strategy={config['strategy']}",
            f"--model={args.model}",
        ]
        if "spe" in config:
            task.append(f"--steps_per_execution={config['spe']}")
    task += [
        f"--global_batch_size={args.global_batch_size}",
        f"--epochs={args.epochs}",
        f"--steps_per_epoch={args.steps_per_epoch}",
    ]
    if not config.get("peer"):
        task.append(f"--model_dir={model_dir}")
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
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"error: --configs names {unknown}, expected names from {list(CONFIGS)}")
    samples = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-ps-") as tmp:
        for round_index in range(args.rounds):
            for name in names:
                work = pathlib.Path(tmp) / f"round{round_index}"
                value = _run(name, args, work)
                samples[name].append(value)
                print(f"round {round_index + 1}: {name}: {value:.0f} examples/s", flush=True)
    baseline_name = names[0]
    baseline = statistics.median(samples[baseline_name])
    print(
        f"\n{args.model}, global batch {args.global_batch_size}, "
        f"{args.epochs}x{args.steps_per_epoch} steps, median of {args.rounds} rounds\n"
    )
    print(f"| run | examples/s | vs {baseline_name} |")
    print("|---|---:|---:|")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.0f} | {median / baseline:.2f}x |")


if __name__ == "__main__":
    main()
