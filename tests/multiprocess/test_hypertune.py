"""tfdist.outputs.hypertune: the metric file Vertex AI tuning reads, chief only, and
per-trial output directories."""

import os
import subprocess
import sys

import pytest

from tests.unit.test_hypertune import _lines  # shared with the in-process half

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_metric_file_matches_cloudml_hypertune(tmp_path):
    """Our lines equal the cloudml-hypertune package's (timestamps aside)."""
    pytest.importorskip("hypertune")
    env = dict(os.environ, PYTHONPATH=REPO, CLOUD_ML_TRIAL_ID="12")
    script = (
        "import sys, hypertune\n"
        "from tfdist.outputs import hypertune as ours\n"
        "theirs = hypertune.HyperTune()\n"
        "mine = ours.MetricReporter(metric_file=sys.argv[2])\n"
        "for step, value in ((100, 0.5), (200, 0.75), (0, 1)):\n"
        "    theirs.report_hyperparameter_tuning_metric('val_auc', value, step)\n"
        "    mine.report('val_auc', value, step)\n"
    )
    env["CLOUD_ML_HP_METRIC_FILE"] = str(tmp_path / "theirs.metrics")
    subprocess.run(
        [sys.executable, "-c", script, "", str(tmp_path / "ours.metrics")],
        env=env,
        check=True,
        timeout=60,
    )
    theirs, ours = _lines(tmp_path / "theirs.metrics"), _lines(tmp_path / "ours.metrics")
    for entry in theirs + ours:
        entry.pop("timestamp")
    assert ours == theirs and len(ours) == 3


def test_helpers_import_no_keras():
    code = (
        "import sys, tfdist.outputs.hypertune, tfdist.outputs.export; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tensorflow')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=REPO),
        check=True,
    )
    assert result.stdout.strip() == "[]"
