"""Start-up banners of TensorFlow's native libraries, and the filter that drops them."""

import subprocess
import sys


def test_upstream_still_logs_before_initializing_absl_whatever_the_level():
    """When this fails, TF_CPP_MIN_LOG_LEVEL works again and the filter can go."""
    result = subprocess.run(
        [sys.executable, "-c", "import tensorflow"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "All log messages before absl::InitializeLog() is called" in result.stderr


def test_the_quiet_import_keeps_other_stderr_output():
    code = (
        "import builtins, sys\n"
        "from tfdist._internal import startup_logs\n"
        "real_import = builtins.__import__\n"
        "def noisy_import(name, *args, **kwargs):\n"
        "    if name == 'tensorflow':\n"
        "        sys.stderr.write('a line of my own\\n')\n"
        "    return real_import(name, *args, **kwargs)\n"
        "builtins.__import__ = noisy_import\n"
        "tf = startup_logs.import_tensorflow_quietly({})\n"
        "print(tf.__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "tensorflow"
    assert "a line of my own" in result.stderr
    assert "absl::InitializeLog()" not in result.stderr
    assert "oneDNN custom operations" not in result.stderr
