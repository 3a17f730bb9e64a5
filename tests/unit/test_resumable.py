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
