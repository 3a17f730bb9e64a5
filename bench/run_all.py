"""Reruns the benchmark tables of docs/benchmarks.md in one run and draws the figures.

    python bench/run_all.py --quick      # ~10 min on 2 busy vCPUs
    python bench/run_all.py              # ~20 min; adds the older scripts' tables

Everything compared in a table runs in the same run, alternating, and is
reported as medians with the load average before and after. Training
comparisons run in one child process per round (same model, same data, same
global batch), cycling through the variants in a rotated order each round;
every variant starts from a fresh model.

Writes `docs/benchmark_results.json`, `docs/benchmark_results.md` (every
table), `docs/bench_examples_per_second.png` (examples/s by strategy and
setting) and `docs/bench_restart.png` (time to the first batch by step).
Figures need the `bench` extra (matplotlib); without it the tables are still
written.

Sections (`--sections`, comma-separated):
  speed      trainer defaults vs plain Keras `fit` with Keras defaults (goal >= 1.3x),
             steps per execution 1 vs auto, mirrored
  callbacks  bench_callbacks: tfdist's callbacks on vs off, one process and 2 workers
             (goal <= 3%)
  multiworker  bench_fused_multiworker (2 workers, fused vs Python-loop executions, goal
             >= 1.2x) and bench_replica_jit (XLA per replica vs none under MirroredStrategy)
  mixed      float32 vs mixed_bfloat16 vs mixed_float16: step time and test accuracy
  input      bench_input: input-only vs training throughput; time to first batch by step
  allreduce  bench_allreduce: 2 workers vs a loopback socket; bfloat16 all-reduce accuracy
  older      the older scripts' tables (parameter server, optimizers, backups), reduced
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

BATCH = 64
SPEED_EPOCHS, SPEED_STEPS = 2, 640
SECTIONS = ("speed", "callbacks", "multiworker", "mixed", "input", "allreduce", "older")


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _environ() -> dict:
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC") and not key.startswith("AIP_")
    }
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return environ


def _child(*args: str, timeout: float = 1800) -> dict:
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--side=child", *args]
    result = subprocess.run(
        command,
        cwd=REPO,
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- child side: training runs


def _trainer(
    model: str, *, epochs: int = SPEED_EPOCHS, steps: int = SPEED_STEPS, **overrides
) -> dict:
    """One `trainer.run.run` in this process; returns its summary (+ chosen spe)."""
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.distribute import execution_tuner  # pylint: disable=g-import-not-at-top
    from tfdist.distribute.cluster import resolve_cluster  # pylint: disable=g-import-not-at-top
    from trainer import config as config_lib  # pylint: disable=g-import-not-at-top
    from trainer import run as run_lib  # pylint: disable=g-import-not-at-top

    keras.mixed_precision.set_global_policy("float32")
    chosen = {}
    original = execution_tuner.tune_steps_per_execution

    def recording(*args, **kwargs):
        result = original(*args, **kwargs)
        chosen["steps_per_execution"] = result.steps_per_execution
        chosen["probe_seconds"] = result.probe_seconds
        return result

    execution_tuner.tune_steps_per_execution = recording
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for key in ("model_dir", "backup_dir"):
                if overrides.get(key) is True:
                    overrides[key] = os.path.join(scratch, key)
            config = config_lib.ExperimentConfig(
                model=model,
                epochs=epochs,
                steps_per_epoch=steps,
                global_batch_size=BATCH,
                **overrides,
            )
            summary = run_lib.run(config, resolve_cluster({}), environ={})
    finally:
        execution_tuner.tune_steps_per_execution = original
    summary = dict(summary)
    summary.update(chosen)
    return summary


def _plain_keras(model_name: str, *, epochs: int = SPEED_EPOCHS, steps: int = SPEED_STEPS) -> dict:
    """What a Keras user writes: compile with defaults (spe 1, no XLA), `fit`."""
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.data import training_batches  # pylint: disable=g-import-not-at-top
    from trainer.run.throughput import ThroughputMeter  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    task = BuiltinTask(model=model_name, dataset="synthetic", num_examples=8192)
    train = training_batches(
        task.build_inputs(True), global_batch_size=BATCH, seed=0, num_examples=8192
    )
    model = task.build_model()
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    meter = ThroughputMeter(global_batch_size=BATCH)
    model.fit(
        train, epochs=epochs, steps_per_epoch=steps, callbacks=[meter], verbose=0, shuffle=False
    )
    return {"examples_per_second": meter.examples_per_second}


SPEED_VARIANTS = {
    # name: (callable, kwargs)
    "keras fit (Keras defaults)": ("plain", {}),
    "trainer defaults": ("trainer", {"model_dir": True}),
    "trainer, spe 1": ("trainer", {"model_dir": True, "steps_per_execution": 1}),
    "trainer, mirrored": ("trainer", {"model_dir": True, "strategy": "mirrored"}),
}
MIXED_VARIANTS = {
    "float32": {"mixed_precision": "none"},
    "mixed_bfloat16": {"mixed_precision": "mixed_bfloat16"},
    "mixed_float16": {"mixed_precision": "mixed_float16"},
}


def _rotated(names: list, shift: int) -> list:
    shift %= len(names)
    return names[shift:] + names[:shift]


def child(section: str, model: str, round_index: int, quick: bool) -> dict:
    results = {}
    if section == "speed":
        for name in _rotated(list(SPEED_VARIANTS), round_index):
            kind, kwargs = SPEED_VARIANTS[name]
            summary = _plain_keras(model) if kind == "plain" else _trainer(model, **dict(kwargs))
            results[name] = {
                "examples_per_second": summary["examples_per_second"],
                "steps_per_execution": summary.get("steps_per_execution"),
                "probe_seconds": summary.get("probe_seconds"),
            }
            print(f"{model} {name}: {summary['examples_per_second']:.0f}", file=sys.stderr)
    elif section == "mixed":
        epochs = 2 if quick else 3
        for name in _rotated(list(MIXED_VARIANTS), round_index):
            summary = _trainer(model, epochs=epochs, steps=128, **MIXED_VARIANTS[name])
            results[name] = {
                "examples_per_second": summary["examples_per_second"],
                "test_accuracy": summary["metrics"]["test"].get("accuracy"),
                "final_loss": summary["final_loss"],
            }
            print(f"{model} {name}: {results[name]}", file=sys.stderr)
    elif section == "allreduce_accuracy":
        results = _allreduce_accuracy(model, round_index, quick)
    return results


def _allreduce_accuracy(model_name: str, round_index: int, quick: bool) -> dict:
    """MirroredStrategy on 2 logical CPUs; gradients all-reduced in float32 vs bfloat16."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist import keras_compat  # pylint: disable=g-import-not-at-top
    from tfdist.data import evaluation_batches, training_batches  # pylint: disable=g-import-not-at-top
    from trainer.run.throughput import ThroughputMeter  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    task = BuiltinTask(model=model_name, dataset="synthetic", num_examples=8192)
    results = {}
    for dtype in _rotated(["float32", "bfloat16"], round_index):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = task.build_model()
            model.compile(
                optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                loss=task.loss(),
                metrics=task.metrics(),
            )
        keras_compat.set_gradient_all_reduce_dtype(model.optimizer, dtype)
        meter = ThroughputMeter(global_batch_size=BATCH)
        model.fit(
            training_batches(
                task.build_inputs(True), global_batch_size=BATCH, seed=0, num_examples=8192
            ),
            epochs=2 if quick else 3,
            steps_per_epoch=128,
            callbacks=[meter],
            verbose=0,
            shuffle=False,
        )
        test = model.evaluate(
            evaluation_batches(task.build_inputs(False), global_batch_size=BATCH),
            verbose=0,
            return_dict=True,
        )
        results[dtype] = {
            "test_accuracy": float(test["accuracy"]),
            "test_loss": float(test["loss"]),
            "examples_per_second": meter.examples_per_second,
        }
        print(f"{model_name} all-reduce {dtype}: {results[dtype]}", file=sys.stderr)
    return results


# ---------------------------------------------------------------- driver side


def _rounds_of(section: str, models: list[str], rounds: int, quick: bool) -> dict:
    """{model: {variant: [run dicts]}} over `rounds` child processes per model."""
    collected = {model: {} for model in models}
    for round_index in range(rounds):
        for model in models if round_index % 2 == 0 else models[::-1]:
            result = _child(
                f"--section={section}",
                f"--model={model}",
                f"--round={round_index}",
                *(["--quick"] if quick else []),
            )
            for name, row in result.items():
                collected[model].setdefault(name, []).append(row)
    return collected


def _median(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else None


def speed_section(rounds: int, quick: bool) -> dict:
    load_before = load_average()
    runs = _rounds_of("speed", ["mlp", "cnn"], rounds, quick)
    table = {}
    for model, variants in runs.items():
        base = _median(variants["keras fit (Keras defaults)"], "examples_per_second")
        table[model] = {
            name: {
                "median_examples_per_second": _median(rows, "examples_per_second"),
                "ratio_to_keras": _median(rows, "examples_per_second") / base,
                "chosen_steps_per_execution": sorted(
                    {row["steps_per_execution"] for row in rows if row.get("steps_per_execution")}
                ),
                "median_probe_seconds": _median(rows, "probe_seconds"),
                "runs": [row["examples_per_second"] for row in rows],
            }
            for name, rows in variants.items()
        }
    return {
        "table": table,
        "rounds": rounds,
        "epochs": SPEED_EPOCHS,
        "steps_per_epoch": SPEED_STEPS,
        "global_batch_size": BATCH,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def mixed_section(rounds: int, quick: bool) -> dict:
    load_before = load_average()
    runs = _rounds_of("mixed", ["mlp", "cnn"], rounds, quick)
    table = {}
    for model, variants in runs.items():
        base = _median(variants["float32"], "examples_per_second")
        table[model] = {
            name: {
                "median_examples_per_second": _median(rows, "examples_per_second"),
                "ratio_to_float32": _median(rows, "examples_per_second") / base,
                "median_test_accuracy": _median(rows, "test_accuracy"),
                "median_final_loss": _median(rows, "final_loss"),
            }
            for name, rows in variants.items()
        }
    return {
        "table": table,
        "rounds": rounds,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def callbacks_section(rounds: int, quick: bool) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_callbacks.py"),
            f"--rounds={rounds}",
            f"--quick={quick}",
        ],
        cwd=REPO,
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-4000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def _json_of(script: str, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        cwd=REPO,
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{script} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def multiworker_section(rounds: int, quick: bool) -> dict:
    return {
        "fused": _json_of("bench_fused_multiworker.py", f"--pairs={rounds}"),
        "replica_jit": _json_of(
            "bench_replica_jit.py",
            f"--pairs={min(rounds, 2)}",
            *(["--models=mlp"] if quick else []),
        ),
    }


def input_section(rounds: int, quick: bool) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_input.py"),
            f"--rounds={rounds}",
            "--steps=200" if quick else "--steps=300",
            *(["--quick"] if quick else []),
        ],
        cwd=REPO,
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-4000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def allreduce_section(rounds: int, quick: bool) -> dict:
    import bench_allreduce  # pylint: disable=g-import-not-at-top

    transfer = bench_allreduce.measure(
        "1,16" if quick else "1,16,128", repeats=5, rounds=1 if quick else 2
    )
    load_before = load_average()
    runs = _rounds_of("allreduce_accuracy", ["mlp"] if quick else ["mlp", "cnn"], rounds, quick)
    accuracy = {
        model: {
            dtype: {
                "median_test_accuracy": _median(rows, "test_accuracy"),
                "median_test_loss": _median(rows, "test_loss"),
                "median_examples_per_second": _median(rows, "examples_per_second"),
            }
            for dtype, rows in variants.items()
        }
        for model, variants in runs.items()
    }
    return {
        "transfer": transfer,
        "accuracy": accuracy,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


# The "Trainer overhead" table (bench_overhead.py) is the `speed` section's first rows now.
OLDER = (
    ("parameter server", ["bench/bench_parameter_server.py", "--rounds=1", "--steps_per_epoch=60"]),
    ("optimizers (speed)", ["bench/bench_optimizers.py", "--part=speed", "--rounds=3"]),
    ("backups", ["bench/bench_backup.py", "--rounds=1"]),
)


def older_section() -> dict:
    out = {}
    for name, command in OLDER:
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, *command],
            cwd=REPO,
            env=_environ(),
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        out[name] = {
            "command": " ".join(["python", *command]),
            "exit_code": result.returncode,
            "seconds": time.perf_counter() - started,
            "output_tail": (result.stdout + result.stderr)[-2500:],
        }
    return out


# ---------------------------------------------------------------- report


def _fmt(value, digits=0):
    return "–" if value is None else f"{value:,.{digits}f}"


def _callbacks_markdown(callbacks: dict) -> list[str]:
    lines = ["## Callbacks overhead (goal ≤ 3%)", ""]
    single = callbacks.get("single_process")
    if single:
        shapes = ", ".join(
            f"{model} {run['epochs']}×{run['steps_per_epoch']}"
            for model, run in single["runs"].items()
        )
        lines += [
            f"One process: {single['rounds']} rounds alternating, steps {shapes}, backup "
            f"every {single['backup_every_steps']} steps; load "
            f"{single['load_average_before']} → {single['load_average_after']}.",
            "",
            "| model, spe | off examples/s | on examples/s | overhead (medians) | median of "
            "same-round pairs | time in tfdist callbacks / fit time | first backup ms | "
            "later backups ms (median) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in single["table"].items():
            lines.append(
                f"| {name} | {_fmt(row['off_examples_per_second'])} | "
                f"{_fmt(row['on_examples_per_second'])} | {100 * row['overhead']:.1f}% | "
                f"{100 * row['median_pair_overhead']:.1f}% | "
                f"{100 * row['callback_share_of_fit']:.2f}% | "
                f"{1e3 * row['first_backup_seconds']:.0f} | "
                f"{1e3 * row['later_backup_seconds']:.1f} |"
            )
        lines.append("")
    workers = callbacks.get("two_workers")
    if workers:
        lines += [
            f"2 workers (MultiWorkerMirroredStrategy, loopback): {workers['rounds']} "
            f"rounds alternating, {workers['epochs']}×{workers['steps_per_epoch']} steps, "
            f"backup every {workers['backup_every_steps']} steps; load "
            f"{workers['load_average_before']} → {workers['load_average_after']}.",
            "",
            "| model, spe | off examples/s | on | overhead (medians) | median of pairs | "
            "on, collective check | overhead (medians) | median of pairs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in workers["table"].items():
            on, old = row["on"], row["on, collective check"]
            lines.append(
                f"| {name} | {_fmt(row['off_examples_per_second'])} | "
                f"{_fmt(on['examples_per_second'])} | {100 * on['overhead']:.1f}% | "
                f"{100 * on['median_pair_overhead']:.1f}% | "
                f"{_fmt(old['examples_per_second'])} | {100 * old['overhead']:.1f}% | "
                f"{100 * old['median_pair_overhead']:.1f}% |"
            )
        lines.append("")
    return lines


def markdown(results: dict) -> str:
    lines = [
        "# Benchmark results (generated by `python bench/run_all.py"
        f"{' --quick' if results['quick'] else ''}`)",
        "",
        f"Run at {results['started']} UTC, {os.cpu_count()} CPUs, load average "
        f"{results['load_average_before']} before, {results['load_average_after']} after; "
        f"{results['seconds']:.0f} s.",
        "",
    ]
    if "speed" in results:
        speed = results["speed"]
        lines += [
            "## Trainer vs plain Keras fit; steps per execution",
            "",
            f"{speed['rounds']} rounds alternating, {speed['epochs']}×"
            f"{speed['steps_per_epoch']} steps, global batch {speed['global_batch_size']},"
            f" synthetic data; load {speed['load_average_before']} → "
            f"{speed['load_average_after']}.",
            "",
            "| model | variant | median examples/s | vs Keras fit | spe chosen | probe s |",
            "|---|---|---:|---:|---|---:|",
        ]
        for model, rows in speed["table"].items():
            for name, row in rows.items():
                lines.append(
                    f"| {model} | {name} | {_fmt(row['median_examples_per_second'])} | "
                    f"{row['ratio_to_keras']:.2f}x | "
                    f"{row['chosen_steps_per_execution'] or ''} | "
                    f"{_fmt(row['median_probe_seconds'], 1)} |"
                )
        lines.append("")
    if "callbacks" in results:
        lines += _callbacks_markdown(results["callbacks"])
    if "multiworker" in results:
        fused, jit = results["multiworker"]["fused"], results["multiworker"]["replica_jit"]
        medians = fused["median_steps_per_second"]
        lines += [
            "## Fused executions under 2 workers; XLA per replica",
            "",
            f"{fused['model']}, 2 workers, spe {fused['steps_per_execution']}, "
            f"{fused['timed_steps']} timed steps, {len(fused['runs']['fused'])} runs each; "
            f"load {fused['load_average_before']} → {fused['load_average_after']}.",
            "",
            "| fused steps/s | Python-loop steps/s | ratio of medians (goal ≥ 1.2×) |",
            "|---:|---:|---:|",
            f"| {medians['fused']:.1f} | {medians['python_loop']:.1f} | "
            f"{fused['ratio_fused_over_python_loop']:.2f}× |",
            "",
            f"XLA per replica, MirroredStrategy; load {jit['load_average_before']} → "
            f"{jit['load_average_after']}.",
            "",
            "| model | devices | XLA examples/s | no XLA examples/s | XLA / no XLA |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in jit["rows"]:
            lines.append(
                f"| {row['model']} | {row['devices']} | "
                f"{_fmt(row['median_examples_per_second']['xla'])} | "
                f"{_fmt(row['median_examples_per_second']['plain'])} | "
                f"{row['ratio_xla_over_plain']:.2f} |"
            )
        lines.append("")
    if "mixed" in results:
        mixed = results["mixed"]
        lines += [
            "## Mixed precision",
            "",
            f"load {mixed['load_average_before']} → {mixed['load_average_after']}",
            "",
            "| model | policy | median examples/s | vs float32 | test accuracy | final loss |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for model, rows in mixed["table"].items():
            for name, row in rows.items():
                lines.append(
                    f"| {model} | {name} | {_fmt(row['median_examples_per_second'])} | "
                    f"{row['ratio_to_float32']:.2f}x | "
                    f"{_fmt(row['median_test_accuracy'], 3)} | "
                    f"{_fmt(row['median_final_loss'], 3)} |"
                )
        lines.append("")
    if "input" in results:
        data = results["input"]
        lines += [
            "## Input pipeline",
            "",
            f"load {data['load_average_before']} → {data['load_average_after']}",
            "",
            "| data | what | median examples/s |",
            "|---|---|---:|",
        ]
        for row in data.get("throughput", {}).get("rows", []):
            what = (
                f"input only, {row['pipeline']} pipeline"
                if row["kind"] == "input"
                else f"training {row['model']}, spe {row['steps_per_execution']}"
            )
            lines.append(
                f"| {row['dataset']} | {what} | {_fmt(row['median_examples_per_second'])} |"
            )
        lines += [
            "",
            "| data | pipeline | first step | median s to first batch |",
            "|---|---|---:|---:|",
        ]
        for row in data.get("restart", {}).get("rows", []):
            lines.append(
                f"| {row['dataset']} | {row['pipeline']} | {row['first_step']:,} | "
                f"{row['median_seconds']:.2f} |"
            )
        lines.append("")
    if "allreduce" in results:
        transfer = results["allreduce"]["transfer"]
        lines += [
            "## All-reduce between 2 local workers",
            "",
            f"load {transfer['load_average_before']} → {transfer['load_average_after']}",
            "",
            "| MB | socket ms | ring f32 ms | ring bf16 ms | auto f32 ms | auto bf16 ms "
            "| ring f32 vs socket |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in transfer["rows"]:
            lines.append(
                f"| {row['size_mb']} | {1e3 * row['socket_seconds']:.1f} | "
                f"{1e3 * row['ring_float32_seconds']:.1f} | "
                f"{1e3 * row['ring_bfloat16_seconds']:.1f} | "
                f"{1e3 * row['auto_float32_seconds']:.1f} | "
                f"{1e3 * row['auto_bfloat16_seconds']:.1f} | "
                f"{row['ring_float32_vs_socket']:.1f}x |"
            )
        lines += [
            "",
            "| model | all-reduce dtype | test accuracy | test loss | examples/s |",
            "|---|---|---:|---:|---:|",
        ]
        for model, rows in results["allreduce"]["accuracy"].items():
            for dtype, row in rows.items():
                lines.append(
                    f"| {model} | {dtype} | {_fmt(row['median_test_accuracy'], 4)} | "
                    f"{_fmt(row['median_test_loss'], 4)} | "
                    f"{_fmt(row['median_examples_per_second'])} |"
                )
        lines.append("")
    if "older" in results:
        lines += ["## Older tables (reduced runs)", ""]
        for name, row in results["older"].items():
            lines += [
                f"### {name}",
                "",
                f"`{row['command']}` → exit {row['exit_code']}, {row['seconds']:.0f} s",
                "",
                "```",
                row["output_tail"].strip(),
                "```",
                "",
            ]
    return "\n".join(lines) + "\n"


def figures(results: dict, out_dir: pathlib.Path) -> list[str]:
    try:
        import matplotlib  # pylint: disable=g-import-not-at-top

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    except ImportError:
        print("matplotlib is missing (pip install -e .[bench]); no figures", file=sys.stderr)
        return []
    written = []
    if "speed" in results:
        table = results["speed"]["table"]
        names = list(next(iter(table.values())))
        figure, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4.5))
        for axis, (model, rows) in zip(axes, table.items()):
            values = [rows[n]["median_examples_per_second"] for n in names]
            axis.barh(range(len(names)), values, color=["#888"] + ["#3a7"] * (len(names) - 1))
            axis.set_yticks(range(len(names)), names, fontsize=8)
            axis.invert_yaxis()
            axis.set_title(f"{model}: examples/s (median), global batch {BATCH}")
            for index, value in enumerate(values):
                axis.text(
                    value,
                    index,
                    f" {rows[names[index]]['ratio_to_keras']:.2f}x",
                    va="center",
                    fontsize=8,
                )
        figure.suptitle(f"load average {results['speed']['load_average_before']}", fontsize=8)
        figure.tight_layout()
        path = out_dir / "bench_examples_per_second.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(str(path))
    if "input" in results and "restart" in results["input"]:
        rows = results["input"]["restart"]["rows"]
        figure, axis = plt.subplots(figsize=(6.5, 4.5))
        for dataset in sorted({row["dataset"] for row in rows}):
            for pipeline in ("tfdist", "linear"):
                points = sorted(
                    (row["first_step"], row["median_seconds"])
                    for row in rows
                    if row["dataset"] == dataset and row["pipeline"] == pipeline
                )
                if points:
                    axis.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        marker="o",
                        label=f"{dataset}, {pipeline}",
                    )
        axis.set_xscale("symlog", linthresh=1000)
        axis.set_xlabel("first step of the resumed stream")
        axis.set_ylabel("seconds to the first batch (median)")
        axis.set_title("Restart cost of the input stream by step")
        axis.legend(fontsize=8)
        figure.tight_layout()
        path = out_dir / "bench_restart.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(str(path))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("driver", "child"), default="driver")
    parser.add_argument("--section", default="")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller runs")
    parser.add_argument("--sections", default="")
    parser.add_argument("--rounds", type=int, default=0, help="default 2 (--quick) or 3")
    parser.add_argument("--output_dir", default=str(REPO / "docs"))
    args = parser.parse_args()
    if args.side == "child":
        print(json.dumps(child(args.section, args.model, args.round, args.quick)))
        return
    sections = [s for s in (args.sections or ",".join(SECTIONS)).split(",") if s]
    if args.quick and not args.sections:
        sections.remove("older")
    rounds = args.rounds or (2 if args.quick else 3)
    started = time.perf_counter()
    results = {
        "quick": args.quick,
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "load_average_before": load_average(),
    }
    runners = {
        "speed": lambda: speed_section(rounds, args.quick),
        "callbacks": lambda: callbacks_section(rounds, args.quick),
        "multiworker": lambda: multiworker_section(rounds, args.quick),
        "mixed": lambda: mixed_section(min(rounds, 2), args.quick),
        "input": lambda: input_section(min(rounds, 2), args.quick),
        "allreduce": lambda: allreduce_section(min(rounds, 2), args.quick),
        "older": older_section,
    }
    for section in sections:
        section_started = time.perf_counter()
        results[section] = runners[section]()
        print(f"{section}: {time.perf_counter() - section_started:.0f} s", file=sys.stderr)
    results["load_average_after"] = load_average()
    results["seconds"] = time.perf_counter() - started
    out_dir = pathlib.Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmark_results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "benchmark_results.md").write_text(markdown(results))
    for path in figures(results, out_dir):
        print(f"wrote {path}", file=sys.stderr)
    print(markdown(results))


if __name__ == "__main__":
    main()
