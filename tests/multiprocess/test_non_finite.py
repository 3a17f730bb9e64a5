"""Non-finite training stops with its own error before anything non-finite is saved.

A NaN loss (checked every batch from the logs Keras already has) or a NaN/Inf
variable (checked before every backup, in one fused reduction) raises
`NonFiniteError`; the last finite backup stays byte-for-byte; command-line
entry points exit with `tfdist.cli.EXIT_NON_FINITE` and one line on stderr.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cli_maps_non_finite_error_to_its_exit_code(tmp_path):
    script = (
        "from tfdist import cli, errors\n"
        "def main(argv):\n"
        "    raise errors.NonFiniteError('the training loss is nan at step 6\\nmore')\n"
        "cli.run(main, ['prog'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    from tfdist import cli

    assert cli.EXIT_NON_FINITE not in (0, 1, 2, 137, 143)
    assert result.returncode == cli.EXIT_NON_FINITE
    assert result.stderr.strip().splitlines() == ["error: the training loss is nan at step 6 more"]
