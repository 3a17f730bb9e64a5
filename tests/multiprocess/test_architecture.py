"""The import rules of docs/architecture.md, and the old module paths kept importable.

- `tfdist` never imports `trainer` (every import statement of every module, lazy ones too);
- a tfdist package imports only the packages its row of the layer table allows;
- the configuration modules never import TensorFlow (imported in a fresh interpreter);
- every path in `tfdist._moved.MOVED` is the very module object of its new path, with a
  DeprecationWarning naming the new path; Keras-registered names did not move.

(regroup: keep old paths - the rewrite of issue 22 skips this file.)
"""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Modules that parse configuration or run before TensorFlow may be loaded.
TENSORFLOW_FREE = (
    "tfdist",
    "tfdist.errors",
    "tfdist.cli",
    "tfdist._internal.preconditions",
    "tfdist.distribute.cluster",
    "tfdist.distribute.choice",
    "tfdist.distribute.flags",
    "tfdist.launch",
    "tfdist.launch.launcher",
    "tfdist.launch.local_cluster",
    "tfdist.launch.testing",
    "tfdist.outputs.hypertune",
    "tfdist.optimizers",
    "tfdist.optimizers.choice",
    "tfdist.optimizers.exclusions",
    "trainer.config",
    "trainer.options",
    "trainer.submission",
    "trainer.vertex.options",
    "trainer.vertex.command",
    "trainer.vertex.spec",
    "trainer.vertex.validation",
    "trainer.kubernetes",
    "trainer.kubernetes.options",
    "trainer.kubernetes.manifest",
    "trainer.kubernetes.jobset",
    "trainer.vertex.follow",
)


def test_configuration_modules_do_not_import_tensorflow():
    # One fresh interpreter: after each import, TensorFlow (or Keras) must still be absent,
    # so the first module that loads it is named.
    program = (
        "import importlib, json, sys\n"
        f"for name in {list(TENSORFLOW_FREE)!r}:\n"
        "    importlib.import_module(name)\n"
        "    heavy = sorted({'tensorflow', 'keras'} & set(sys.modules))\n"
        "    if heavy:\n"
        "        print(json.dumps([name, heavy])); break\n"
        "else:\n"
        "    print(json.dumps(None))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) is None, (
        f"this module imported TensorFlow or Keras: {result.stdout.strip()}"
    )


def test_importing_the_local_cluster_defines_no_launcher_flags():
    # The launcher's flags (--workers, --ps, ...) would collide with a program's own.
    program = (
        "import tfdist.launch, tfdist.launch.local_cluster\n"
        "from tfdist.launch import local_cluster, testing\n"
        "from absl import flags\n"
        "print(sorted({'workers', 'ps', 'chief', 'timeout'} & set(flags.FLAGS)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
