"""Builds the project's source distribution and stages it in Cloud Storage.

Vertex AI's prebuilt training images install the package named in
`pythonPackageSpec.packageUris` and run `python -m trainer.task` from it.

The staged object's name is derived from the archive's contents (file names and
bytes, not the tar/gzip timestamps), so building twice from the same sources
gives the same name and a second submission reuses the staged package.
"""

import dataclasses
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile

from tfdist.errors import UsageError

# What the sdist is built from: the build configuration and the two packages.
_PROJECT_FILES = ("setup.cfg", "pyproject.toml", "setup.py", "README.md", "MANIFEST.in",
                  "LICENSE")
_PACKAGES = ("tfdist", "trainer")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info")
PACKAGES_PREFIX = "tfdist/packages"


@dataclasses.dataclass(frozen=True)
class BuiltPackage:
    """A built sdist and the name it is staged under.

    Attributes:
        path: Local path of the archive (inside a temporary directory).
        staged_name: `<name>-<version>-<content digest>.tar.gz`.
        size: Archive size in bytes.
    """

    path: str
    staged_name: str
    size: int

    def uri(self, staging_bucket: str) -> str:
        """Where the package lives under `staging_bucket` (a gs:// URI)."""
        return f"{staging_bucket.rstrip('/')}/{PACKAGES_PREFIX}/{self.staged_name}"


def find_project_root() -> str:
    """The source checkout holding `setup.cfg` and the `trainer` package.

    Raises:
        UsageError: `trainer` was installed without its sources.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "setup.cfg")):
        raise UsageError(
            f"no setup.cfg next to the trainer package (looked in {root}), expected a "
            f"tfdist source checkout to build the package from; run from a checkout, or "
            f"use our own image (--container_uri) which needs no package")
    return root


def build_sdist(project_root: str, out_dir: str) -> BuiltPackage:
    """Builds the sdist of `project_root` into `out_dir`.

    The sources are copied to a scratch directory first, so the build leaves
    nothing (such as `*.egg-info`) in the checkout. The build's own output is
    shown (on stderr) only when it fails.

    Raises:
        UsageError: The build failed; the message holds its last output line.
    """
    import build  # The `build` front end; imported here to keep `--help` fast.
    import pyproject_hooks

    with tempfile.TemporaryDirectory(prefix="tfdist-src-") as scratch:
        source = os.path.join(scratch, "src")
        os.makedirs(source)
        for name in _PROJECT_FILES:
            if os.path.isfile(os.path.join(project_root, name)):
                shutil.copy2(os.path.join(project_root, name), source)
        for package in _PACKAGES:
            shutil.copytree(os.path.join(project_root, package),
                            os.path.join(source, package), ignore=_IGNORED)
        builder = build.ProjectBuilder(source, python_executable=sys.executable,
                                       runner=_quiet_runner)
        try:
            path = builder.build("sdist", out_dir)
        except (build.BuildException, build.BuildBackendException,
                pyproject_hooks.BackendUnavailable) as error:
            last_line = (str(error).strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"building the sdist from {project_root} failed ({last_line}); "
                             f"expected `python -m build --sdist` to work there") from None
    base = os.path.basename(path)[:-len(".tar.gz")]
    return BuiltPackage(path=path, staged_name=f"{base}-{content_digest(path)[:16]}.tar.gz",
                        size=os.path.getsize(path))


def _quiet_runner(cmd, cwd=None, extra_environ=None):
    """Runs a build hook quietly; on failure its output goes to stderr."""
    import subprocess

    env = os.environ.copy()
    env.update(extra_environ or {})
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, check=False)
    if result.returncode:
        sys.stderr.write(result.stdout[-4000:])
        raise subprocess.CalledProcessError(result.returncode, cmd)


def content_digest(archive_path: str) -> str:
    """SHA-256 over the archive's member names and file contents, in name order."""
    digest = hashlib.sha256()
    with tarfile.open(archive_path, "r:gz") as archive:
        members = sorted((m for m in archive.getmembers() if m.isfile()),
                         key=lambda member: member.name)
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
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud import storage  # Only a real submission needs the client.

    uri = package.uri(staging_bucket)
    bucket_name, _, blob_name = uri[len("gs://"):].partition("/")
    try:
        client = client or storage.Client()
        blob = client.bucket(bucket_name).blob(blob_name)
        if blob.exists():
            print(f"Package already staged (same contents): {uri}", file=sys.stderr)
        else:
            print(f"Uploading {os.path.basename(package.path)} ({package.size} bytes) to "
                  f"{uri}", file=sys.stderr)
            blob.upload_from_filename(package.path, content_type="application/gzip")
    except auth_exceptions.DefaultCredentialsError:
        raise UsageError(
            "no Application Default Credentials found, expected credentials to upload the "
            "package; run `gcloud auth application-default login`") from None
    except api_exceptions.GoogleAPICallError as error:
        summary = " ".join(str(error.message or "").split())[:300]
        raise UsageError(f"uploading the package to {uri} failed ({error.code}: {summary}); "
                         f"expected a bucket you can write to: check --staging_bucket and "
                         f"its permissions") from None
    return uri
