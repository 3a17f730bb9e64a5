"""Cost of backups: throughput with backups every N steps, and restart latency.

(a) `throughput`: the `cnn` on the offline synthetic data (global batch 64, Adam)
    trained for the same steps without backups and with
    `tfdist.callbacks.BackupAndRestore(save_freq=50)` (plus the epoch-end
    backup), in alternating rounds on the same process. Reported: examples/s
    (best and median over rounds), the ratio, and the time per backup.
    Each backup run uses a new callback, so it pays the first backup's one-time
    cost (tracing the checkpoint writer) as a freshly started job does; the
    steady cost of one backup is also timed directly, over repeated saves.
(b) `restart`: time from launching `python` to the end of the first training
    step, for a clean start (empty backup directory) and for a restart that
    resumes from a backup recorded at step R (restore, validation with
    checksums, and skipping R batches of the input stream included). Each in a
    fresh process, alternating.

    python bench/bench_backup.py                    # both parts, ~3 min on 2 CPUs
    python bench/bench_backup.py --part=throughput --rounds=5
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MODEL = "cnn"
BATCH = 64
NUM_EXAMPLES = 8192


def _setup(seed: int = 0):
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.data import training_batches  # pylint: disable=g-import-not-at-top
    from trainer.tasks.builtin import BuiltinTask  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(seed)
    task = BuiltinTask(model=MODEL, dataset="synthetic", num_examples=NUM_EXAMPLES, seed=seed)

    def stream(first_step: int = 0):
        return training_batches(
            task.build_inputs(True),
            global_batch_size=BATCH,
            seed=seed,
            num_examples=NUM_EXAMPLES,
            first_step=first_step,
        )

    model = task.build_model()
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return stream, model


def _directory_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


# --------------------------------------------------------------------------- (a)


def _timed_backup_class():
    from tfdist.callbacks import BackupAndRestore  # pylint: disable=g-import-not-at-top

    class TimedBackup(BackupAndRestore):
        """Adds up the wall time spent restoring and saving."""

        seconds = 0.0

        def restore(self, model=None):
            started = time.perf_counter()
            try:
                return super().restore(model)
            finally:
                self.seconds += time.perf_counter() - started

        def _save(self):
            started = time.perf_counter()
            super()._save()
            self.seconds += time.perf_counter() - started

    return TimedBackup


def bench_throughput(args) -> None:
    timed_backup = _timed_backup_class()

    epochs, steps = 2, args.steps // 2
    stream, model = _setup()
    model.fit(stream(), epochs=1, steps_per_epoch=5, verbose=0, shuffle=False)  # trace
    results = {"none": [], "backup": []}
    cpu = {"none": [], "backup": []}
    inside = []
    backup_bytes = 0
    for _ in range(args.rounds):
        for mode in ("none", "backup"):
            callbacks, backup_dir = [], None
            if mode == "backup":
                backup_dir = tempfile.mkdtemp(prefix="bench-backup-")
                callbacks = [
                    timed_backup(
                        backup_dir, save_freq=args.every, delete_checkpoint=False, preemption=None
                    )
                ]
            wall, process = time.perf_counter(), time.process_time()
            model.fit(
                stream(),
                epochs=epochs,
                steps_per_epoch=steps,
                verbose=0,
                shuffle=False,
                callbacks=callbacks,
            )
            wall, process = time.perf_counter() - wall, time.process_time() - process
            results[mode].append(epochs * steps * BATCH / wall)
            cpu[mode].append(process)
            if backup_dir:
                inside.append(callbacks[0].seconds)
                newest = sorted(
                    name for name in os.listdir(backup_dir) if name.startswith("backup-")
                )[-1]
                backup_bytes = _directory_bytes(os.path.join(backup_dir, newest))
                shutil.rmtree(backup_dir)
    total = epochs * steps
    saves = len(
        {step for step in range(args.every, total + 1, args.every)}
        | {steps * (epoch + 1) for epoch in range(epochs)}
    )
    best = {mode: max(values) for mode, values in results.items()}
    median = {mode: statistics.median(values) for mode, values in results.items()}
    seconds_per_save = (
        (total * BATCH / median["backup"]) - (total * BATCH / median["none"])
    ) / saves
    print(
        f"\n(a) throughput: {MODEL}, global batch {BATCH}, {total} steps, {args.rounds} "
        f"rounds, backups every {args.every} steps + epoch ends = {saves} backups of "
        f"{backup_bytes / 1e6:.2f} MB"
    )
    print("| run | best examples/s | median examples/s | median CPU s | ratio (median) |")
    print("|---|---|---|---|---|")
    for mode, label in (("none", "no backups"), ("backup", f"backup every {args.every}")):
        print(
            f"| {label} | {best[mode]:.0f} | {median[mode]:.0f} | "
            f"{statistics.median(cpu[mode]):.1f} | {median[mode] / median['none']:.3f} |"
        )
    none_seconds = total * BATCH / median["none"]
    print(f"time per backup from the throughput medians: {1e3 * seconds_per_save:.0f} ms")
    print(
        f"wall time inside restore + backups per run (median): "
        f"{statistics.median(inside):.2f} s = {1e3 * statistics.median(inside) / saves:.0f} "
        f"ms per backup = {100 * statistics.median(inside) / none_seconds:.1f}% of the "
        f"median run without backups ({none_seconds:.2f} s)"
    )
    first, steady = _time_saves(model)
    print(
        f"one backup, timed directly: first {1e3 * first:.0f} ms (includes tracing the "
        f"checkpoint writer), then median {1e3 * steady:.0f} ms"
    )


def _time_saves(model, count: int = 10) -> tuple[float, float]:
    from tfdist.backups import BackupStore, TrainingBackup  # pylint: disable=g-import-not-at-top

    backup_dir = tempfile.mkdtemp(prefix="bench-saves-")
    backup = TrainingBackup(BackupStore(backup_dir), model)
    seconds = []
    for step in range(1, count + 1):
        started = time.perf_counter()
        backup.save(global_step=step, epoch=0, step_in_epoch=step)
        seconds.append(time.perf_counter() - started)
    shutil.rmtree(backup_dir)
    return seconds[0], statistics.median(seconds[1:])


# --------------------------------------------------------------------------- (b)


def child(args) -> None:
    """One process: start, (resume,) train until the first step ends, report."""
    import keras  # pylint: disable=g-import-not-at-top

    from tfdist.callbacks import BackupAndRestore  # pylint: disable=g-import-not-at-top

    stream, model = _setup()
    backup = BackupAndRestore(args.backup_dir, save_freq=args.every, preemption=None)
    restore_started = time.perf_counter()
    segments = backup.resume(model, epochs=args.epochs, steps_per_epoch=args.steps)
    restore_seconds = time.perf_counter() - restore_started

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            with open(args.report, "w") as handle:
                handle.write(f"{time.time()} {restore_seconds} {backup.resumed_from_step}")
            os._exit(0)  # pylint: disable=protected-access

    segment = segments[0]
    model.fit(
        stream(segment.first_step),
        verbose=0,
        shuffle=False,
        callbacks=[FirstStep(), backup],
        **segment.fit_kwargs(),
    )


def _prepare_backup(path: str, resume_at: int, args) -> None:
    """A backup recorded at step `resume_at` (the weights' values do not matter here)."""
    from tfdist.backups import BackupStore, TrainingBackup  # pylint: disable=g-import-not-at-top

    _, model = _setup()
    epoch, step_in_epoch = divmod(resume_at, args.steps)
    TrainingBackup(BackupStore(path), model).save(
        global_step=resume_at, epoch=epoch, step_in_epoch=step_in_epoch, steps_per_epoch=args.steps
    )


def _launch(backup_dir: str, report: str, args) -> tuple[float, float, int]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--part=child",
        f"--backup_dir={backup_dir}",
        f"--report={report}",
        f"--every={args.every}",
        f"--steps={args.steps}",
        f"--epochs={args.epochs}",
    ]
    launched = time.time()
    subprocess.run(
        command,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    with open(report) as handle:
        first_step, restore, resumed = handle.read().split()
    return float(first_step) - launched, float(restore), int(resumed)


def bench_restart(args) -> None:
    resume_points = [int(step) for step in args.resume_at.split(",")]
    work = tempfile.mkdtemp(prefix="bench-restart-")
    prepared = {}
    for step in resume_points:
        prepared[step] = os.path.join(work, f"prepared-{step}")
        _prepare_backup(prepared[step], step, args)
    timings = {"clean": []}
    restores = {"clean": []}
    for step in resume_points:
        timings[step], restores[step] = [], []
    for _ in range(args.rounds):
        for key in ("clean", *resume_points):
            backup_dir = os.path.join(work, "run")
            shutil.rmtree(backup_dir, ignore_errors=True)
            if key != "clean":
                shutil.copytree(prepared[key], backup_dir)
            seconds, restore, resumed = _launch(backup_dir, os.path.join(work, "report"), args)
            assert resumed == (0 if key == "clean" else key), (key, resumed)
            timings[key].append(seconds)
            restores[key].append(restore)
    shutil.rmtree(work, ignore_errors=True)
    clean = statistics.median(timings["clean"])
    print(
        f"\n(b) restart: launch -> end of first training step, {MODEL}, global batch "
        f"{BATCH}, median of {args.rounds} fresh processes each"
    )
    print("| start | median s | best s | of which restore() s | vs clean start |")
    print("|---|---|---|---|---|")
    for key in ("clean", *resume_points):
        label = "clean start" if key == "clean" else f"resume from step {key}"
        median = statistics.median(timings[key])
        print(
            f"| {label} | {median:.2f} | {min(timings[key]):.2f} | "
            f"{statistics.median(restores[key]):.2f} | {median / clean:.2f}x "
            f"(+{median - clean:.2f} s) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", default="all", choices=("all", "throughput", "restart", "child"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=400, help="(a) total steps per run; (b) steps per epoch"
    )
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument(
        "--epochs",
        type=int,
        default=0,
        help="(b) planned epochs; default: past the latest resume point",
    )
    parser.add_argument("--resume_at", default="300,10000")
    parser.add_argument("--backup_dir", default="")
    parser.add_argument("--report", default="")
    args = parser.parse_args()
    if not args.epochs:
        args.epochs = max(int(step) for step in args.resume_at.split(",")) // args.steps + 2
    if args.part == "child":
        child(args)
        return
    print(
        f"python {' '.join(sys.argv)}; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs"
    )
    if args.part in ("all", "throughput"):
        bench_throughput(args)
    if args.part in ("all", "restart"):
        bench_restart(args)


if __name__ == "__main__":
    main()
