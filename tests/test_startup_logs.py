"""Start-up banners of TensorFlow's native libraries, and the filter that drops them."""

import subprocess
import sys

from tfdist._internal import startup_logs

CAPTURED = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796052236.610875   18865 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results.
I0000 00:00:1796052236.611256   18865 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
/site-packages/foo.py:3: UserWarning: something a user should see
E0000 00:00:1796052239.260881   18865 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error
E0000 00:00:1796052239.260881   18865 some_op.cc:52] a real error
""".splitlines(keepends=True)


def test_only_the_banners_are_dropped():
    kept = startup_logs.without_banners(CAPTURED, has_nvidia_device=False)
    assert kept == [CAPTURED[3], CAPTURED[5]]


def test_cuda_lines_are_kept_where_there_is_an_nvidia_device():
    kept = startup_logs.without_banners(CAPTURED, has_nvidia_device=True)
    assert kept == [CAPTURED[2], *CAPTURED[3:]]


def test_upstream_still_logs_before_initializing_absl_whatever_the_level():
    """When this fails, TF_CPP_MIN_LOG_LEVEL works again and the filter can go."""
    result = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True,
                            text=True, timeout=120, check=False,
                            env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "All log messages before absl::InitializeLog() is called" in result.stderr


def test_the_quiet_import_keeps_other_stderr_output():
    code = ("import builtins, sys\n"
            "from tfdist import startup_logs\n"
            "real_import = builtins.__import__\n"
            "def noisy_import(name, *args, **kwargs):\n"
            "    if name == 'tensorflow':\n"
            "        sys.stderr.write('a line of my own\\n')\n"
            "    return real_import(name, *args, **kwargs)\n"
            "builtins.__import__ = noisy_import\n"
            "tf = startup_logs.import_tensorflow_quietly({})\n"
            "print(tf.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "tensorflow"
    assert "a line of my own" in result.stderr
    assert "absl::InitializeLog()" not in result.stderr
    assert "oneDNN custom operations" not in result.stderr
