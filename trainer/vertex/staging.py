"""Builds source distributions and stages them in Cloud Storage.

Vertex AI's prebuilt training images pip-install every URI in
`pythonPackageSpec.packageUris` and run `python -m trainer.task`: our sdist,
and (with `--task_package`) the user's own project, so that
`--task=my_pkg.mod:MyTask` imports.

What goes into an sdist is the project's own build configuration's decision
(setup.cfg / pyproject.toml, MANIFEST.in): the whole source tree is copied to
a scratch directory (so the build writes nothing such as `*.egg-info` into the
checkout), minus version-control, cache and build-output directories, and built
there with `build`. Its `build-system.requires` must already be installed (no
downloads at submit time); anything missing is named in a one-line error.

The staged object's name is derived from the archive's contents (file names and
bytes, not the tar/gzip timestamps), so building twice from the same sources
gives the same name and a second submission reuses the staged package.
"""

import dataclasses
import hashlib
import logging
import os
import shutil
import sys
import tarfile
import tempfile

from tfdist.errors import UsageError
from trainer.vertex.checks import ServiceError, quoted, require
from trainer.vertex.dependencies import require_module

PACKAGES_PREFIX = "tfdist/packages"
PROJECT_FILES = ("pyproject.toml", "setup.cfg", "setup.py")
MAX_SOURCE_BYTES = 256 << 20
MAX_SOURCE_FILES = 20_000
_SKIPPED_ANYWHERE = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".ipynb_checkpoints",
)
_SKIPPED_AT_TOP = ("build", "dist", ".venv", "venv", "node_modules", ".eggs")


@dataclasses.dataclass(frozen=True)
class BuiltPackage:
    """A built sdist and the name it is staged under.

    Attributes:
        path: Local path of the archive (inside a temporary directory).
        staged_name: `<name>-<version>-<content digest>.tar.gz`.
        size: Archive size in bytes.
        source: The project directory it was built from.
    """

    path: str
    staged_name: str
    size: int
    source: str = ""

    def uri(self, staging_bucket: str) -> str:
        """Where the package lives under `staging_bucket` (a gs:// URI)."""
        return f"{staging_bucket.rstrip('/')}/{PACKAGES_PREFIX}/{self.staged_name}"


def find_project_root() -> str:
    """The source checkout holding our `setup.cfg` and the `trainer` package.

    Raises:
        UsageError: `trainer` was installed without its sources.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    require(
        os.path.isfile(os.path.join(root, "setup.cfg")),
        f"no setup.cfg next to the trainer package (looked in {root}), expected a tfdist "
        f"source checkout to build the package from; run from a checkout, or use our own "
        f"image (--container_uri) which needs no package",
    )
    return root


def check_task_package(path: str) -> str:
    """`path` made absolute, if it is a Python project directory.

    Raises:
        UsageError: Not a directory, or without pyproject.toml/setup.cfg/setup.py.
    """
    shown = quoted(path)
    require(
        os.path.isdir(path),
        f"--task_package {shown} is not a directory, expected your "
        f"project's directory (with pyproject.toml, setup.cfg or "
        f"setup.py)",
    )
    require(
        any(os.path.isfile(os.path.join(path, name)) for name in PROJECT_FILES),
        f"--task_package {shown} has none of {', '.join(PROJECT_FILES)}, expected a "
        f"Python project that pip can install; add a pyproject.toml naming your package",
    )
    return os.path.abspath(path)


def build_sdist(project_root: str, out_dir: str, *, flag: str = "the trainer") -> BuiltPackage:
    """Builds the sdist of `project_root` into `out_dir`.

    Args:
        project_root: The project directory.
        out_dir: Where the archive goes.
        flag: What the project is, for messages (`--task_package`, ...).

    Raises:
        UsageError: `build` is missing, the tree is too large, the build
            system's requirements are not installed, or the build failed.
    """
    build = require_module("build", purpose=f"building {flag}'s sdist")
    logging.getLogger("build").setLevel(logging.WARNING)  # its progress lines are noise here
    with tempfile.TemporaryDirectory(prefix="tfdist-src-") as scratch:
        source = os.path.join(scratch, "src")
        _copy_sources(project_root, source, flag)
        builder = build.ProjectBuilder(
            source, python_executable=sys.executable, runner=_quiet_runner
        )
        # The static build-system.requires only: asking the backend for more
        # would cost one more hook subprocess per build.
        missing = sorted(
            {
                chain[0]
                for requirement in builder.build_system_requires
                for chain in build.check_dependency(requirement)
            }
        )
        require(
            not missing,
            f"building {flag} from {quoted(project_root)} needs "
            f"{quoted(', '.join(missing))} (its "
            f"build-system.requires), which is not installed; pip install them and submit "
            f"again",
        )
        try:
            path = builder.build("sdist", out_dir)
        except Exception as error:  # noqa: BLE001 (build, backend and hook errors alike)
            raise UsageError(
                f"building {flag} from {quoted(project_root)} failed "
                f"({quoted(_last_line(error))}); expected `python -m build "
                f"--sdist` to work there"
            ) from None
    base = os.path.basename(path)
    stem = base[: -len(".tar.gz")] if base.endswith(".tar.gz") else base
    return BuiltPackage(
        path=path,
        staged_name=f"{stem}-{content_digest(path)[:16]}.tar.gz",
        size=os.path.getsize(path),
        source=project_root,
    )


def _copy_sources(project_root: str, target: str, flag: str) -> None:
    """Copies the tree, skipping VCS, caches and build outputs, within size limits."""
    total, files = 0, 0
    root = os.path.abspath(project_root)
    for directory, subdirectories, names in os.walk(root):
        top = directory == root
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in _SKIPPED_ANYWHERE
            and not name.endswith(".egg-info")
            and not (top and name in _SKIPPED_AT_TOP)
            and not os.path.islink(os.path.join(directory, name))
        )
        relative = os.path.relpath(directory, root)
        os.makedirs(os.path.join(target, relative), exist_ok=True)
        for name in names:
            source = os.path.join(directory, name)
            if name.endswith((".pyc", ".pyo")) or not os.path.isfile(source):
                continue
            total += os.path.getsize(source)
            files += 1
            require(
                total <= MAX_SOURCE_BYTES and files <= MAX_SOURCE_FILES,
                f"{flag} {quoted(project_root)} holds more than {MAX_SOURCE_BYTES >> 20} MB "
                f"or {MAX_SOURCE_FILES} files, expected a source tree; move data and "
                f"outputs out of it",
            )
            shutil.copy2(source, os.path.join(target, relative, name))


def _last_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[-1]


def _quiet_runner(cmd, cwd=None, extra_environ=None):
    """Runs a build hook quietly; on failure its output goes to stderr."""
    import subprocess

    env = os.environ.copy()
    env.update(extra_environ or {})
    result = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode:
        sys.stderr.write(result.stdout[-4000:])
        raise subprocess.CalledProcessError(result.returncode, cmd)


def content_digest(archive_path: str) -> str:
    """SHA-256 over the archive's member names and file contents, in name order."""
    digest = hashlib.sha256()
    with tarfile.open(archive_path, "r:gz") as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.isfile()), key=lambda member: member.name
        )
        for member in members:
            data = archive.extractfile(member).read()
            digest.update(member.name.encode("utf-8") + b"\0")
            digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def stage(package: BuiltPackage, staging_bucket: str, *, client=None) -> str:
    """Uploads `package` under `staging_bucket` unless it is already there.

    Args:
        package: The built sdist.
        staging_bucket: `gs://bucket[/prefix]`.
        client: A `google.cloud.storage.Client`; by default one with Application
            Default Credentials (or, with `STORAGE_EMULATOR_HOST` set, the
            emulator without credentials, as the client library decides).

    Returns:
        The package's gs:// URI.
    """
    storage = require_module("google.cloud.storage", purpose="uploading the package")
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions

    requests = require_module("requests", purpose="uploading the package")

    uri = package.uri(staging_bucket)
    bucket_name, _, blob_name = uri[len("gs://") :].partition("/")
    try:
        client = client or storage.Client()
        blob = client.bucket(bucket_name).blob(blob_name)
        if blob.exists():
            print(f"Package already staged (same contents): {uri}", file=sys.stderr)
        else:
            print(
                f"Uploading {os.path.basename(package.path)} ({package.size} bytes) to {uri}",
                file=sys.stderr,
            )
            blob.upload_from_filename(package.path, content_type="application/gzip")
    except auth_exceptions.DefaultCredentialsError:
        raise UsageError(
            "no Application Default Credentials found, expected credentials to upload the "
            "package; run `gcloud auth application-default login`"
        ) from None
    except (
        requests.exceptions.RequestException,
        auth_exceptions.TransportError,
        api_exceptions.RetryError,
    ) as error:
        raise ServiceError(
            f"Cloud Storage could not be reached to upload {uri} "
            f"({quoted(_last_line(error))}); check the network"
        ) from None
    except api_exceptions.GoogleAPICallError as error:
        summary = quoted(" ".join(str(error.message or "").split()), 300)
        if error.code is None or int(error.code) >= 500:
            raise ServiceError(
                f"uploading the package to {uri} failed ({error.code}: {summary}); try again later"
            ) from None
        raise UsageError(
            f"uploading the package to {uri} failed ({error.code}: {summary}); "
            f"expected a bucket you can write to: check --staging_bucket and "
            f"its permissions"
        ) from None
    return uri
