"""`tfdist.resumable`: a Keras script gains strategy, exact resume and preemption in three lines."""

import difflib
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "resumable_script"


def test_the_script_changes_by_at_most_three_lines():
    before = (SCRIPTS / "before.py").read_text().splitlines()
    after = (SCRIPTS / "after.py").read_text().splitlines()
    changed = sum(
        max(i2 - i1, j2 - j1)
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after).get_opcodes()
        if tag != "equal"
    )
    assert changed <= 3


def test_a_script_without_a_strategy_upgrades_without_reindenting_a_line():
    """examples/no_strategy_script: lines are added, and only `model.fit(` and the save change."""
    scripts = REPO / "examples" / "no_strategy_script"
    before = (scripts / "before.py").read_text().splitlines()
    after = (scripts / "after.py").read_text().splitlines()
    opcodes = difflib.SequenceMatcher(a=before, b=after).get_opcodes()
    replaced = [before[i1:i2] for tag, i1, i2, _, _ in opcodes if tag in ("replace", "delete")]
    assert replaced == [["model.fit("], ['model.save(f"{OUT}/model.keras")']]
    added = [line for tag, _, _, j1, j2 in opcodes if tag != "equal" for line in after[j1:j2]]
    assert [line for line in added if line.strip()] == [
        "import tfdist.resumable",
        "tfdist.resumable.set_strategy_from_environment()  # no `with strategy.scope():` needed",
        "tfdist.resumable.fit(",
        "    model,",
        '    backup_dir=f"{OUT}/backup",',
        "    save_freq=10,",
        'model.save(tfdist.resumable.write_path(f"{OUT}/model.keras"))  # the chief\'s lands there',
    ]
