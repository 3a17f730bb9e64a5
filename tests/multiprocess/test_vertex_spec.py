"""The job model (trainer.vertex.spec): impossible shapes refused, and the CustomJob
it becomes (trainer.vertex.rendering)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_job_spec_module_imports_neither_tensorflow_nor_google_cloud():
    import subprocess

    # `google.cloud` itself is a namespace package that site-packages' .pth files
    # load at start-up; its submodules (aiplatform, storage) are the heavy part.
    code = (
        "import sys, trainer.submit, trainer.vertex.spec, trainer.vertex.rendering, "
        "trainer.vertex.tuning, trainer.vertex.staging, trainer.vertex.serving; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras') or m.startswith('google.cloud.')))"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    assert result.stdout.strip() == "[]", result.stdout
