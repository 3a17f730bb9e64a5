"""Experiment configuration: embedded default < --config file < explicit flags."""

import pathlib
import subprocess
import sys


def test_the_configuration_modules_do_not_import_tensorflow():
    code = (
        "import sys, trainer.config, trainer.flags_doc, tfdist.optimizers.choice; "
        "print(sorted({'tensorflow', 'keras'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == "[]", result.stderr
