"""What do tfdist's callbacks cost? The trainer with them on vs off (goal <= 3%).

"On": `--backup_dir` with `--backup_every_steps=500` (plus the backup at each
epoch end), the preemption check after every execution and TensorBoard per
epoch (`--model_dir`). "Off": none of them. Same trainer, same fixed steps per
execution on both sides, same data, global batch 64.

- One process (mlp and cnn, spe 20 and spe 1): each round is one child
  process per model that runs every variant in a rotated order, each from a
  fresh model. Runs last about 10 s at spe 20 (3 epochs of 3000 mlp or 1500
  cnn steps: a dozen or six backups inside the timed windows), so the first
  backup's one-time cost (tracing the checkpoint writer and the finiteness
  check) does not stand for the steady cost; both are reported. In the "on"
  runs the child also times every call into tfdist's callbacks, so the table
  shows what they cost directly, next to the ratio.
- Two local workers (`tfdist.launch`, MultiWorkerMirroredStrategy, mlp, spe 1
  and 10): off, on, and on with the preemption check agreed by a collective
  at every check (how tfdist agreed before it used the coordination service).

Every comparison alternates within the run and reports medians, the median
of same-round pairs, and the load average before and after. The last line of
stdout is the JSON result (`bench/run_all.py --sections=callbacks` reads it).

    python bench/bench_callbacks.py                 # 3 rounds, ~12 min on 2 vCPUs
    python bench/bench_callbacks.py --rounds=5 --parts=single
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import two_workers
from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]
BATCH = 64
BACKUP_EVERY = 500
# About 10 s of training per run at spe 20 on this machine's 2 vCPUs.
SINGLE_RUN = {
    "mlp": {"epochs": 3, "steps_per_epoch": 3000},
    "cnn": {"epochs": 3, "steps_per_epoch": 1500},
}
WORKERS_RUN = {"epochs": 2, "steps_per_epoch": 750}
QUICK_RUN = {"epochs": 2, "steps_per_epoch": 500}
SINGLE_VARIANTS = tuple(
    f"callbacks {state}, spe {spe}" for spe in (20, 1) for state in ("off", "on")
)
WORKER_SPES = (1, 10)
WORKER_VARIANTS = ("off", "on", "on, collective check")

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.", lower_bound=1)
_QUICK = flags.DEFINE_bool("quick", False, "Short runs (a smoke test; one-time costs dominate).")
_PARTS = flags.DEFINE_list("parts", ["single", "workers"], "single and/or workers.")
_SIDE = flags.DEFINE_enum("side", None, ["child", "worker"], "Internal.")
_MODEL = flags.DEFINE_string("model", "mlp", "With --side=child: the model.")
_ROUND = flags.DEFINE_integer("round", 0, "With --side=child: the round (rotates the order).")
_VARIANT = flags.DEFINE_string("variant", None, "With --side=worker: the variant.")
_SPE = flags.DEFINE_integer("steps_per_execution", 1, "With --side=worker.")
_RESULT = flags.DEFINE_string("result", None, "With --side=worker: the chief writes JSON here.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the result JSON here.")


def _load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _config(model: str, spe: int, on: bool, scratch: str, run: dict, **extra):
    from trainer import config as config_lib  # pylint: disable=g-import-not-at-top

    outputs = (
        {
            "model_dir": os.path.join(scratch, "model"),
            "backup_dir": os.path.join(scratch, "backup"),
            "backup_every_steps": BACKUP_EVERY,
        }
        if on
        else {}
    )
    return config_lib.ExperimentConfig(
        model=model, global_batch_size=BATCH, steps_per_execution=spe, **run, **outputs, **extra
    )


class _HookClock:
    """Adds up the wall time of every call into tfdist's callbacks (the "on" runs)."""

    HOOKS = (
        "on_train_batch_end",
        "on_epoch_begin",
        "on_epoch_end",
        "on_train_begin",
        "on_train_end",
    )

    def __init__(self):
        from tfdist.callbacks import BackupAndRestore, EpochTensorBoard, NonFiniteGuard  # pylint: disable=g-import-not-at-top

        self.seconds = 0.0
        self.batch_end_seconds = 0.0
        self.backup_seconds = []
        self._originals = [(BackupAndRestore, "_save", BackupAndRestore._save)]
        BackupAndRestore._save = self._timed_backup(BackupAndRestore._save)
        for cls in (BackupAndRestore, EpochTensorBoard, NonFiniteGuard):
            for hook in self.HOOKS:
                original = cls.__dict__.get(hook)
                if original is not None:
                    self._originals.append((cls, hook, original))
                    setattr(cls, hook, self._timed(hook, original))

    def _timed(self, hook, original):
        def timed(callback, *args, **kwargs):
            start = time.perf_counter()
            try:
                return original(callback, *args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.seconds += elapsed
                if hook == "on_train_batch_end":
                    self.batch_end_seconds += elapsed

        return timed

    def _timed_backup(self, original):
        def timed(callback):
            start = time.perf_counter()
            try:
                return original(callback)
            finally:
                self.backup_seconds.append(time.perf_counter() - start)

        return timed

    def close(self):
        for cls, hook, original in self._originals:
            setattr(cls, hook, original)


class _TrainingClock:
    """Wall time of `fit` (the whole trainer run minus setup is not separable; fit is)."""

    def __init__(self):
        import keras  # pylint: disable=g-import-not-at-top

        self.seconds = 0.0
        self._original = keras.Model.fit
        clock = self

        def fit(model, *args, **kwargs):
            start = time.perf_counter()
            try:
                return clock._original(model, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - start

        keras.Model.fit = fit

    def close(self):
        import keras  # pylint: disable=g-import-not-at-top

        keras.Model.fit = self._original


def _single_run(model: str) -> dict:
    return QUICK_RUN if _QUICK.value else SINGLE_RUN[model]


def _workers_run() -> dict:
    return QUICK_RUN if _QUICK.value else WORKERS_RUN


def child_side() -> None:
    """One round of the single-process variants for one model; prints JSON."""
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.distribute.cluster import resolve_cluster  # pylint: disable=g-import-not-at-top
    from trainer import run as run_lib  # pylint: disable=g-import-not-at-top

    keras.mixed_precision.set_global_policy("float32")
    shift = _ROUND.value % len(SINGLE_VARIANTS)
    results = {}
    for name in SINGLE_VARIANTS[shift:] + SINGLE_VARIANTS[:shift]:
        on = "on," in name
        spe = int(name.rsplit(" ", 1)[1])
        hooks = _HookClock() if on else None
        fit_clock = _TrainingClock()
        try:
            with tempfile.TemporaryDirectory() as scratch:
                summary = run_lib.run(
                    _config(_MODEL.value, spe, on, scratch, _single_run(_MODEL.value)),
                    resolve_cluster({}),
                    environ={},
                )
        finally:
            fit_clock.close()
            if hooks:
                hooks.close()
        results[name] = {
            "examples_per_second": summary["examples_per_second"],
            "fit_seconds": fit_clock.seconds,
        }
        if hooks:
            results[name].update(
                callback_seconds=hooks.seconds,
                batch_end_callback_seconds=hooks.batch_end_seconds,
                backup_seconds=hooks.backup_seconds,
            )
        print(f"{_MODEL.value} {name}: {results[name]}", file=sys.stderr, flush=True)
    print(json.dumps(results), flush=True)


def worker_side() -> None:
    """One task of a 2-worker run of the trainer; the chief writes its summary."""
    from tfdist.distribute.cluster import resolve_cluster  # pylint: disable=g-import-not-at-top
    from tfdist.preemption import agreement as preemption_agreement  # pylint: disable=g-import-not-at-top
    from trainer import run as run_lib  # pylint: disable=g-import-not-at-top

    if _VARIANT.value == "on, collective check":
        preemption_agreement.CoordinatedStop.available = staticmethod(lambda strategy: False)
    cluster = resolve_cluster(os.environ)
    shared = os.path.dirname(_RESULT.value)  # the launcher's scratch directory
    config = _config(
        "mlp", _SPE.value, _VARIANT.value != "off", shared, _workers_run(), strategy="multiworker"
    )
    summary = run_lib.run(config, cluster, environ=dict(os.environ))
    if cluster.is_chief:
        pathlib.Path(_RESULT.value).write_text(
            json.dumps({"examples_per_second": summary["examples_per_second"]})
        )


def _single_part(rounds: int) -> dict:
    load_before = _load_average()
    runs = {model: {name: [] for name in SINGLE_VARIANTS} for model in ("mlp", "cnn")}
    for round_index in range(rounds):
        for model in ("mlp", "cnn") if round_index % 2 == 0 else ("cnn", "mlp"):
            completed = subprocess.run(
                [
                    sys.executable,
                    str(pathlib.Path(__file__).resolve()),
                    "--side=child",
                    f"--model={model}",
                    f"--round={round_index}",
                    f"--quick={_QUICK.value}",
                ],
                cwd=REPO,
                env=two_workers.child_environ(),
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
            if completed.returncode != 0:
                raise RuntimeError(
                    f"{model} round {round_index} exited "
                    f"{completed.returncode}:\n{completed.stderr[-4000:]}"
                )
            for name, row in json.loads(completed.stdout.strip().splitlines()[-1]).items():
                runs[model][name].append(row)
    table = {}
    for model, variants in runs.items():
        for spe in (20, 1):
            off, on = (variants[f"callbacks {state}, spe {spe}"] for state in ("off", "on"))
            off_rate = statistics.median(row["examples_per_second"] for row in off)
            on_rate = statistics.median(row["examples_per_second"] for row in on)
            pairs = [
                1 - a["examples_per_second"] / b["examples_per_second"] for a, b in zip(on, off)
            ]
            table[f"{model}, spe {spe}"] = {
                "off_examples_per_second": off_rate,
                "on_examples_per_second": on_rate,
                "overhead": 1 - on_rate / off_rate,
                "median_pair_overhead": statistics.median(pairs),
                "callback_share_of_fit": statistics.median(
                    row["callback_seconds"] / row["fit_seconds"] for row in on
                ),
                "first_backup_seconds": statistics.median(row["backup_seconds"][0] for row in on),
                "later_backup_seconds": statistics.median(
                    second for row in on for second in row["backup_seconds"][1:]
                ),
                "backups_per_run": len(on[0]["backup_seconds"]),
                "runs_off": [row["examples_per_second"] for row in off],
                "runs_on": [row["examples_per_second"] for row in on],
            }
    return {
        "table": table,
        "rounds": rounds,
        "runs": {model: _single_run(model) for model in ("mlp", "cnn")},
        "backup_every_steps": BACKUP_EVERY,
        "global_batch_size": BATCH,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
    }


def _two_worker_run(variant: str, spe: int) -> float:
    result = two_workers.run_two_workers(
        str(pathlib.Path(__file__).resolve()),
        f"--variant={variant}",
        f"--steps_per_execution={spe}",
        f"--quick={_QUICK.value}",
        what=f"2 workers, {variant}, spe {spe}",
    )
    return float(result["examples_per_second"])


def _workers_part(rounds: int) -> dict:
    load_before = _load_average()
    runs = {spe: {variant: [] for variant in WORKER_VARIANTS} for spe in WORKER_SPES}
    for round_index in range(rounds):
        shift = round_index % len(WORKER_VARIANTS)
        for spe in WORKER_SPES:
            for variant in WORKER_VARIANTS[shift:] + WORKER_VARIANTS[:shift]:
                runs[spe][variant].append(_two_worker_run(variant, spe))
                print(
                    f"2 workers spe {spe} {variant}: {runs[spe][variant][-1]:.0f}",
                    file=sys.stderr,
                    flush=True,
                )
    table = {}
    for spe, variants in runs.items():
        off = statistics.median(variants["off"])
        row = {"off_examples_per_second": off}
        for variant in WORKER_VARIANTS[1:]:
            rate = statistics.median(variants[variant])
            pairs = [1 - a / b for a, b in zip(variants[variant], variants["off"])]
            row[variant] = {
                "examples_per_second": rate,
                "overhead": 1 - rate / off,
                "median_pair_overhead": statistics.median(pairs),
                "runs": variants[variant],
            }
        row["runs_off"] = variants["off"]
        table[f"mlp, spe {spe}"] = row
    return {
        "table": table,
        "rounds": rounds,
        **_workers_run(),
        "backup_every_steps": BACKUP_EVERY,
        "global_batch_size": BATCH,
        "workers": 2,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
    }


def main(argv) -> None:
    del argv
    if _SIDE.value == "child":
        child_side()
        return
    if _SIDE.value == "worker":
        worker_side()
        return
    result = {}
    if "single" in _PARTS.value:
        result["single_process"] = _single_part(_ROUNDS.value)
    if "workers" in _PARTS.value:
        result["two_workers"] = _workers_part(_ROUNDS.value)
    if _OUTPUT.value:
        pathlib.Path(_OUTPUT.value).write_text(json.dumps(result, indent=2))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    app.run(main)
