"""Typed values from raw option values (flags or JSON): checked, never echoed whole."""

import re
from typing import Any, Mapping, Sequence

from tfdist.errors import UsageError
from trainer.vertex.checks import quoted, require

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_MAX_LABELS = 64
# protobuf Duration's range is 10,000 years; far beyond any job, and a bound.
MAX_DURATION_SECONDS = 315_576_000_000
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
_RESERVATION = re.compile(
    r"^projects/[a-z0-9.:-]+/zones/[a-z]+-[a-z]+[0-9]+-[a-z]/"
    r"reservations/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
)


def string(name: str, value: Any) -> str:
    require(isinstance(value, str), f"--{name} is {quoted(value)}, expected a string")
    return value.strip()


def integer(name: str, value: Any, *, low: int = 0, high: int = 2**31 - 1) -> int:
    """`value` if it is a whole number in `[low, high]`."""
    require(
        isinstance(value, int) and not isinstance(value, bool),
        f"--{name} is {quoted(value)}, expected a whole number from {low} to {high}",
    )
    require(
        low <= value <= high,
        f"--{name} is {quoted(value)}, expected a whole number from {low} to {high}",
    )
    return value


def boolean(name: str, value: Any) -> bool:
    require(isinstance(value, bool), f"--{name} is {quoted(value)}, expected true or false")
    return value


def parse_duration(name: str, text: str | int | None) -> int | None:
    """Seconds in `3600`, `3600s`, `90m`, `2h`, `1d12h`; `None` for empty.

    Raises:
        UsageError: `text` is not such a duration, or beyond protobuf's range.
    """
    if text is None or text == "":
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _DURATION.match(str(text).strip()) if len(str(text)) <= 40 else None
        require(
            bool(match and any(match.groups())),
            f"--{name} is {quoted(text)}, expected a duration such as 3600, 3600s, 90m, 2h or 1d",
        )
        days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
        value = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    require(
        0 <= value <= MAX_DURATION_SECONDS,
        f"--{name} is {quoted(text)}, expected a duration from 0 to {MAX_DURATION_SECONDS} seconds",
    )
    return value


def parse_labels(value: str | Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Labels from `key=value,key=value` (or a JSON object), checked."""
    if value is None or (isinstance(value, (str, Mapping)) and not value):
        return ()
    if isinstance(value, Mapping):
        require(
            all(isinstance(label, str) for label in value.values()),
            f'--labels is {quoted(value)}, expected string values such as {{"team": "vision"}}',
        )
        pairs = [(str(key), label) for key, label in value.items()]
    else:
        require(
            isinstance(value, str), f"--labels is {quoted(value)}, expected key=value,key=value"
        )
        pairs = []
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            require(
                "=" in item,
                f"--labels item {quoted(item)} has no '=', expected "
                f"key=value,key=value such as team=vision,run=exp1",
            )
            key, label = item.split("=", 1)
            pairs.append((key.strip(), label.strip()))
    require(
        len(pairs) <= _MAX_LABELS,
        f"--labels has {len(pairs)} labels, expected at most {_MAX_LABELS}",
    )
    for key, label in pairs:
        require(
            bool(_LABEL_KEY.match(key) and _LABEL_VALUE.match(label)),
            f"--labels has {quoted(f'{key}={label}')}, expected lowercase letters, "
            f"digits, _ and - (keys start with a letter, at most 63 characters each)",
        )
    return tuple(sorted(dict(pairs).items()))


def parse_env(value: Sequence[str] | Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """Environment variables for our replicas from `NAME=VALUE` items or a mapping.

    Error messages name the variable, never its value.
    """
    if value is None or (isinstance(value, (list, tuple, Mapping)) and not value):
        return ()
    if isinstance(value, Mapping):
        require(
            all(isinstance(text, str) for text in value.values()),
            "env has a value that is not a string, expected an object of NAME to string VALUE",
        )
        pairs = [(str(name), text) for name, text in value.items()]
    else:
        require(
            isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value),
            "env is not a list of NAME=VALUE strings or an object, expected "
            '["NAME=VALUE", ...] or {"NAME": "VALUE"}',
        )
        pairs = []
        for item in value:
            name, sep, text = item.partition("=")
            require(bool(sep), f"--env item for {quoted(name)} has no '=', expected NAME=VALUE")
            pairs.append((name, text))
    for name, _ in pairs:
        require(
            bool(_ENV_NAME.match(name)),
            f"--env name {quoted(name)} is not a valid environment variable name, "
            f"expected letters, digits and _",
        )
        require(
            name not in ("TF_CONFIG", "CLUSTER_SPEC", "TFDIST_POOL2_ROLE")
            and not name.startswith(("AIP_", "CLOUD_ML_")),
            f"--env sets {name}, which Vertex AI (or the submitter) sets on every replica; drop it",
        )
    return tuple(pairs)


def parse_reservation_affinity(value: str) -> dict:
    """`reservationAffinity` JSON from `none`, `any` or `specific:RESERVATION`.

    Returns:
        {} when `value` is empty (Vertex AI's default).
    """
    if not value:
        return {}
    kind, _, reservation = str(value).partition(":")
    kind = kind.strip().lower()
    if kind == "none" and not reservation:
        return {"reservationAffinityType": "NO_RESERVATION"}
    if kind == "any" and not reservation:
        return {"reservationAffinityType": "ANY_RESERVATION"}
    require(
        kind == "specific" and bool(_RESERVATION.match(reservation)),
        f"--reservation_affinity is {quoted(value)}, expected none, any, or "
        f"specific:projects/PROJECT/zones/ZONE/reservations/NAME",
    )
    return {
        "reservationAffinityType": "SPECIFIC_RESERVATION",
        "key": RESERVATION_KEY,
        "values": [reservation],
    }


_NFS = re.compile(
    r"^([A-Za-z0-9.-]{1,253}|\[[0-9a-fA-F:]+\]):(/[^:\s]{0,1000}):([A-Za-z0-9_.-]{1,100})$"
)


def parse_nfs_mounts(value) -> tuple[tuple[str, str, str], ...]:
    """`(server, path, mount_point)` from `SERVER:/PATH:MOUNT_POINT` items."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ()
    require(
        isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value),
        f"nfs_mount is {quoted(value)}, expected a list of SERVER:/PATH:MOUNT_POINT strings",
    )
    mounts = []
    for item in value:
        match = _NFS.match(item)
        require(
            bool(match),
            f"--nfs_mount is {quoted(item)}, expected SERVER:/PATH:MOUNT_POINT "
            f"such as 10.0.0.2:/share:data (mounted at /mnt/nfs/data)",
        )
        mounts.append(match.groups())
    points = [point for _, _, point in mounts]
    require(
        len(set(points)) == len(points),
        f"--nfs_mount mount points repeat in {quoted(points)}, expected one per mount",
    )
    return tuple(mounts)


_LUSTRE = re.compile(
    r"^([0-9]{1,3}(?:\.[0-9]{1,3}){3}):([A-Za-z0-9_./-]{1,200}):([A-Za-z0-9_-]{1,100})"
    r":([A-Za-z0-9_.-]{1,100})$"
)
_IP_RANGE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def parse_lustre_mounts(value) -> tuple[tuple[str, str, str, str], ...]:
    """`(instance_ip, volume_handle, filesystem, mount_point)` from `--lustre_mount` items."""
    if not value:
        return ()
    require(
        not isinstance(value, str),
        "lustre_mount is a string, expected a list of "
        "INSTANCE_IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT items",
    )
    require(
        isinstance(value, (list, tuple)),
        f"lustre_mount is {quoted(value)}, expected a list of "
        f"INSTANCE_IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT items",
    )
    mounts = []
    for item in value:
        match = _LUSTRE.match(str(item))
        require(
            bool(match),
            f"--lustre_mount is {quoted(item)}, expected "
            f"INSTANCE_IP:VOLUME_HANDLE:FILESYSTEM:MOUNT_POINT such as "
            f"10.90.1.4:my-project/us-central1-a/lustre1:lfs:data "
            f"(mounted at /mnt/lustre/data)",
        )
        mounts.append(match.groups())
    points = [mount[3] for mount in mounts]
    require(
        len(set(points)) == len(points),
        f"--lustre_mount mount points repeat in {quoted(points)}, expected one per mount",
    )
    return tuple(mounts)


def parse_reserved_ip_ranges(value) -> tuple[str, ...]:
    """The range names of `--reserved_ip_ranges=a,b` (or a list in a config file)."""
    if not value:
        return ()
    require(
        isinstance(value, (str, list, tuple)),
        f"--reserved_ip_ranges is {quoted(value)}, expected the names of reserved IP ranges "
        f"(lowercase letters, digits, hyphens), comma-separated or a list",
    )
    items = value.split(",") if isinstance(value, str) else value
    names = []
    for item in items:
        name = str(item).strip() if isinstance(item, str) else item
        require(
            isinstance(name, str) and bool(_IP_RANGE.match(name)),
            f"--reserved_ip_ranges has {quoted(name)}, expected the names of reserved "
            f"IP ranges (lowercase letters, digits, hyphens), comma-separated",
        )
        names.append(name)
    return tuple(names)


def trainer_args(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(arg, str) for arg in value):
        raise UsageError(
            f"trainer_args is {quoted(value)}, expected a list of trainer.task "
            f'flags such as ["--epochs=10"]'
        )
    return tuple(value)
