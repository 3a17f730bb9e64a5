"""How often the walk of `config` from `trainer.run.run` enters each module (issue #29, 4).

A call that takes the run's `ExperimentConfig` and crosses from one module of
tfdist or trainer into another is one entry into the callee's module. Each
module is entered at most 3 times: a module that a run keeps going back to
with the whole configuration is a rule spread over several places.
"""

import collections
import sys

from tfdist.distribute.cluster import resolve_cluster
from trainer import config as config_lib
from trainer import run as run_lib

MAX_ENTRIES = 3
OURS = ("trainer", "tfdist")


def _entries(config: config_lib.ExperimentConfig) -> dict[str, list[str]]:
    """`{module: ["caller -> module.function", ...]}` for every call given `config`."""
    entries = collections.defaultdict(list)

    def profile(frame, event, arg):
        del arg
        if event != "call" or frame.f_back is None:
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if not any(frame.f_locals.get(name) is config for name in names):
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "")
        if callee.split(".")[0] in OURS and callee != caller:
            entries[callee].append(f"{caller} -> {callee}.{code.co_name}")

    sys.setprofile(profile)
    try:
        run_lib.run(config, resolve_cluster({}), {})
    finally:
        sys.setprofile(None)
    return entries


def test_the_walk_of_config_from_run_enters_no_module_more_than_three_times(tmp_path):
    config = config_lib.ExperimentConfig(
        strategy="default",
        epochs=1,
        steps_per_epoch=2,
        num_examples=128,
        global_batch_size=32,
        backup_every_steps=1,
        model_dir=str(tmp_path / "model"),
        backup_dir=str(tmp_path / "backup"),
    )
    entries = _entries(config)
    assert (tmp_path / "model" / "summary.json").exists()  # the walk was a whole run
    assert "trainer.run.loop" in entries and "trainer.tasks" in entries
    crowded = {module: calls for module, calls in entries.items() if len(calls) > MAX_ENTRIES}
    assert not crowded, crowded
