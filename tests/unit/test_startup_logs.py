"""Start-up banners of TensorFlow's native libraries, and the filter that drops them."""

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
