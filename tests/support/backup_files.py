"""What a backup directory holds, read from its files (not a test module)."""

import os
import pathlib
import re

_BACKUP = re.compile(r"^backup-(\d+)$")


def committed_steps(backup_dir: pathlib.Path) -> list[int]:
    """Steps of the committed backups in `backup_dir`, oldest first."""
    if not backup_dir.is_dir():
        return []
    return sorted(
        int(match.group(1))
        for name in os.listdir(backup_dir)
        if (match := _BACKUP.match(name)) and (backup_dir / name / "COMMITTED").exists()
    )


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    """Every file under `directory` (relative path) with its bytes: to show nothing changed."""
    directory = pathlib.Path(directory)
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def without_bookkeeping(files: dict[str, bytes]) -> dict[str, bytes]:
    """A `snapshot` without what a started run keeps beside its backups.

    Its restart counts (`STARTS.json`, tfdist.backups.restarts) and the lease of a
    run that crashed in this same process (`LEASE.json`, tfdist.backups.lease).
    """
    names = ("STARTS.json", "LEASE.json")

    def kept(path: str) -> bool:
        name = os.path.basename(path)  # also their temporary files while being rewritten
        return name not in names and not any(name.startswith(f".{n}.") for n in names)

    return {path: data for path, data in files.items() if kept(path)}
