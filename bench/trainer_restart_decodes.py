"""Decodes and weights of a trainer restart of a task's own dataset, at the issue's scale (#28).

`python -m trainer.task --task=tests.jobs.tasks.resumed_records:ShuffledRecords` on
24,000 JPEG records in 8 files (`TFRecordDataset(files).map(decode).shuffle(64)`),
global batch 64, one epoch of 375 steps, a backup every 20 steps; in one process
and on 2 local workers (sharded by file, one or more files each): run
uninterrupted, then killed with SIGKILL in step 181 and restarted (from step 180).
Prints one JSON line per layout: each process's decodes (uninterrupted, and
of the restart alone), the step resumed from and the largest weight difference
from the uninterrupted run. Counts, not times: the same on any machine.

    python bench/trainer_restart_decodes.py /tmp/restart-decodes     # ~6 min on 2 CPUs
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tests.jobs.tasks import record_tasks, resumed_records  # noqa: E402
from tfdist.launch.local_cluster import LocalCluster  # noqa: E402

NUM_RECORDS, NUM_FILES, GLOBAL_BATCH = 24_000, 8, 64
KILL_AT_CALL = 182  # the one-batch check calls the loss once, then each step: step 181
ENV = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
WAIT_SECONDS = 1800


def _command(pattern: str, root: pathlib.Path, strategy: str, **config) -> list[str]:
    return resumed_records.trainer_command(
        pattern,
        root,
        strategy=strategy,
        global_batch_size=GLOBAL_BATCH,
        epochs=1,
        backup_every_steps=20,
        **config,
    )


def _decodes(count_dir: pathlib.Path) -> list[int]:
    return sorted(json.loads(p.read_text())["decodes"] for p in count_dir.glob("decodes-*.json"))


def _run(pattern: str, root: pathlib.Path, workers: int, **config) -> list[int]:
    """Exit codes of one run (every process's); its decode counts go to `root/decodes`."""
    count_dir = root / "decodes"
    shutil.rmtree(count_dir, ignore_errors=True)
    count_dir.mkdir(parents=True)
    config["count_dir"] = str(count_dir)
    if workers == 1:
        with open(root / "log.txt", "ab") as log:
            command = _command(pattern, root, "default", **config)
            done = subprocess.run(
                command,
                cwd=REPO,
                env={**os.environ, **ENV},
                stdout=log,
                stderr=log,
                timeout=WAIT_SECONDS,
                check=False,
            )
        return [done.returncode]
    cluster = LocalCluster(
        num_workers=workers,
        command=_command(pattern, root, "multiworker", **config),
        env=ENV,
        log_dir=root / f"logs-{len(list(root.glob('logs-*')))}",
        preload_servers=None,
    )
    cluster.start()
    try:
        return sorted(cluster.wait(timeout=WAIT_SECONDS, stop_on_failure=False).values())
    finally:
        cluster.close()


def _weights(model_dir: pathlib.Path) -> list[np.ndarray]:
    model = keras.saving.load_model(model_dir / "model.keras", safe_mode=True, compile=False)
    return [np.asarray(variable) for variable in model.weights]


def main(out: pathlib.Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pattern = record_tasks.write_tfrecords(str(out / "records"), NUM_RECORDS, num_files=NUM_FILES)
    for workers in (1, 2):
        full, resumed = out / f"uninterrupted-{workers}", out / f"restarted-{workers}"
        kill = {"kill_at_call": KILL_AT_CALL, "kill_marker": str(out / f"killed-{workers}")}
        codes = [_run(pattern, full, workers)]
        uninterrupted = _decodes(full / "decodes")
        codes.append(_run(pattern, resumed, workers, **kill))
        codes.append(_run(pattern, resumed, workers, **kill))
        summary = json.loads((resumed / "model" / "summary.json").read_text())
        difference = max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(_weights(full / "model"), _weights(resumed / "model"), strict=True)
        )
        print(
            json.dumps(
                {
                    "workers": workers,
                    "exit_codes": codes,
                    "resumed_from_step": summary.get("resumed_from_step"),
                    "steps_completed": summary.get("steps_completed"),
                    "uninterrupted_decodes": uninterrupted,
                    "restart_decodes": _decodes(resumed / "decodes"),
                    "max_weight_difference": difference,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/trainer_restart_decodes.py OUTPUT_DIR")
    main(pathlib.Path(sys.argv[1]).resolve())
