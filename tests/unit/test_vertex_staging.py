"""Staging: the trainer's sdist is what setup.cfg decides, and a user's task
package (`--task_package`) is built, named by content and staged next to it so
`--task=my_pkg.mod:MyTask` imports on Vertex AI's prebuilt images."""

import os
import shutil
import tarfile

import pytest

from tfdist.errors import UsageError
from trainer.vertex import staging

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TASK_MODULE = '''
class MyTask:
    """A user's task: only its importability matters here."""

    def __init__(self, units=4):
        self.units = units
'''


def make_user_project(root, *, requires='["setuptools>=61"]', name="my-task"):
    """A tiny user project: pyproject.toml and the package my_pkg with mod.py."""
    (root / "my_pkg").mkdir(parents=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "mod.py").write_text(TASK_MODULE)
    (root / "pyproject.toml").write_text(
        f'[build-system]\nrequires = {requires}\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "1.2.0"\n\n'
        f'[tool.setuptools]\npackages = ["my_pkg"]\n'
    )
    (root / "build").mkdir()  # a stale build output: not part of the sources
    (root / "build" / "junk.txt").write_text("x")
    return root


def test_same_sources_same_name(tmp_path):
    project = make_user_project(tmp_path / "user")
    first = staging.build_sdist(str(project), str(tmp_path / "a"))
    second = staging.build_sdist(str(project), str(tmp_path / "b"))
    assert first.staged_name == second.staged_name
    (project / "my_pkg" / "mod.py").write_text(TASK_MODULE + "\nVERSION = 2\n")
    assert staging.build_sdist(str(project), str(tmp_path / "c")).staged_name != first.staged_name


def test_unmet_build_requirements_are_named(tmp_path):
    project = make_user_project(
        tmp_path / "user", requires='["setuptools>=61", "tfdist-no-such-backend>=9"]'
    )
    with pytest.raises(UsageError) as caught:
        staging.build_sdist(str(project), str(tmp_path / "out"), flag="--task_package")
    message = str(caught.value)
    assert "tfdist-no-such-backend>=9" in message and "build-system.requires" in message
    assert "\n" not in message


def test_a_new_top_level_package_is_packaged_because_setup_cfg_says_so(tmp_path):
    """The sdist holds what setup.cfg decides, not a hand-kept list of packages."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(os.path.join(REPO, name), root / name)
    for package in ("tfdist", "trainer"):
        shutil.copytree(
            os.path.join(REPO, package),
            root / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    (root / "tfdist_contrib").mkdir()
    (root / "tfdist_contrib" / "__init__.py").write_text("EXTRA = 1\n")
    setup_cfg = (root / "setup.cfg").read_text()
    (root / "setup.cfg").write_text(
        setup_cfg.replace("    trainer.*\n", "    trainer.*\n    tfdist_contrib\n", 1)
    )
    package = staging.build_sdist(str(root), str(tmp_path / "out"))
    with tarfile.open(package.path) as archive:
        names = archive.getnames()
    assert "tfdist-0.1.0/tfdist_contrib/__init__.py" in names
    assert "tfdist-0.1.0/trainer/vertex/spec.py" in names
