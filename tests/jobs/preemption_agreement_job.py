"""One task of a 2-worker job that takes lock-step "steps" and asks a PreemptionWatcher.

    python -m tests.jobs.preemption_agreement_job OUT_DIR NOTICE_STEP NOTICE_TASKS

Each step is one all-reduce across the workers (what keeps synchronous training
in lock step). After step NOTICE_STEP every task named in NOTICE_TASKS
(comma-separated, e.g. `worker-1`) sends itself SIGTERM and waits for the
notice. The loop ends when the watcher says stop (or after 200 steps); the task
writes `OUT_DIR/<task>.json` with the step it stopped after and how many
cross-worker gathers the watcher ran.
"""

import json
import os
import pathlib
import signal
import sys

from tfdist.distribute.cluster import resolve_cluster
from tfdist.launch.testing import poll_until

MAX_STEPS = 200


def main() -> None:
    out, notice_step, notice_tasks = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    cluster = resolve_cluster(os.environ)
    task = f"{cluster.task_type}-{cluster.task_index}"

    from tfdist.distribute import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

    strategy = strategy_lib.make_strategy("multiworker", cluster)

    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from tfdist.backups import WorkerSync  # pylint: disable=g-import-not-at-top
    from tfdist.preemption import PreemptionOptions, PreemptionWatcher  # pylint: disable=g-import-not-at-top

    class CountingSync(WorkerSync):
        gathers = 0

        def gather(self, value):
            CountingSync.gathers += 1
            return super().gather(value)

    @tf.function
    def lock_step():
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None
        )

    watcher = PreemptionWatcher(
        PreemptionOptions(grace_period_seconds=60), sync=CountingSync(strategy)
    )
    watcher.install()
    stopped_after = None
    for step in range(1, MAX_STEPS + 1):
        lock_step()
        if step == notice_step and task in notice_tasks.split(","):
            os.kill(os.getpid(), signal.SIGTERM)
            poll_until(lambda: watcher.notice_received, timeout=30, what="the SIGTERM notice")
        if watcher.should_stop(step):
            stopped_after = step
            break
    watcher.close()
    (out / f"{task}.json").write_text(
        json.dumps({"stopped_after": stopped_after, "gathers": CountingSync.gathers})
    )


if __name__ == "__main__":
    main()
