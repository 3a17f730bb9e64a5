"""One writer per backup directory: a lease that the chief holds and renews while it trains.

Two jobs writing one backup directory quarantine each other's backups and, with
different settings, end in a finished-but-empty job. So the chief takes a
lease before it reads or changes anything there:

    backup_dir/LEASE.json   {"owner": "<random id>", "job": "<job id digest>",
                             "fingerprint": "<run fingerprint digest>",
                             "host": "...", "pid": 1234, "process_start": "...",
                             "pid_namespace": 4026531836, "renewed_at": 1796185000.0,
                             "renewals": 17, "lease_seconds": 30.0}

It renews the lease every `lease_seconds / 6` from a timer thread (and checks
it before every backup), and removes it when the job completes, is preempted,
stops on a non-finite value, is refused, or its process exits.

Who may take the directory when a lease is there (`acquire`):

1. **The same job, restarted**: the lease names the same job identity (one of
   `TFDIST_JOB_ID`, Vertex AI's `CLOUD_ML_JOB_ID`, or a digest of the cluster
   addresses in `TF_CONFIG` / `CLUSTER_SPEC`, which the restarts of a TFJob
   keep and another job does not) *and* the same run fingerprint: at once.
2. **The owner's process is gone**: the lease was written on this host (same
   host name, boot and pid namespace) by a process that no longer runs (pid and
   its start time): at once. This covers a job killed with `kill -9` and rerun
   on the same machine.
3. **The owner is a live process on this host**: never; refused at once.
4. **Anyone else** (the owner is on another host, or has no job identity):
   watches the lease. A renewal within `lease_seconds` proves a live owner:
   refused (`BackupInUseError`, exit 2) as soon as it is seen, typically within
   `lease_seconds / 6`. No renewal for `lease_seconds` (measured on this
   process's own clock, so clock skew between hosts does not matter; a lease
   whose last renewal is already older than that is expired at once): the
   owner is dead or frozen, and the lease is taken over.

So a takeover waits at most `lease_seconds` (30 s by default), and not at all
for a recognized restart. A second copy of the same command is never taken for
a restart: on one host its owner is alive (rule 3), and across hosts it has a
different job identity unless it was given the same `TFDIST_JOB_ID` (don't).
If it was, the first copy finds at its next renewal that the lease is no
longer its own and stops before its next backup (`BackupInUseError`). Object
stores have no compare-and-swap: after writing its lease a new owner reads it
back, and the renewal thread keeps checking, which narrows but does not close
the window in which two simultaneous starters both believe they won.
"""

import atexit
import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Mapping

import tensorflow as tf

from tfdist._internal.files import write_json_atomically
from tfdist.errors import BackupInUseError

__all__ = [
    "LEASE_NAME",
    "DEFAULT_LEASE_SECONDS",
    "digest",
    "job_identity",
    "process_start",
    "Holder",
    "BackupLease",
]

LEASE_NAME = "LEASE.json"
DEFAULT_LEASE_SECONDS = 30.0
_RENEWALS_PER_LEASE = 6

_log = logging.getLogger(__name__)


def digest(value) -> str:
    """A short stable digest of a JSON value (never the value itself: it may hold secrets)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def job_identity(addresses: Mapping, environ: Mapping[str, str]) -> str:
    """What restarts of one job share and another job does not; "" when nothing does.

    `TFDIST_JOB_ID` if set, else Vertex AI's `CLOUD_ML_JOB_ID`, else a digest
    of the cluster's task addresses (a single process has none).
    """
    for name in ("TFDIST_JOB_ID", "CLOUD_ML_JOB_ID"):
        if environ.get(name):
            return f"{name}:{digest(environ[name])}"
    if sum(len(hosts) for hosts in addresses.values()) > 1:
        return "cluster:" + digest({role: list(hosts) for role, hosts in addresses.items()})
    return ""


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None if it does not run."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces; the fields after its ")" are fixed.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its file says."""

    owner: str
    job: str
    fingerprint: str
    host: str
    pid: int
    process_start: str
    boot: str
    pid_namespace: int
    renewed_at: float
    renewals: int
    lease_seconds: float

    @classmethod
    def parse(cls, record) -> "Holder | None":
        if not isinstance(record, dict):
            return None
        try:
            return cls(
                owner=str(record["owner"]),
                job=str(record.get("job", "")),
                fingerprint=str(record.get("fingerprint", "")),
                host=str(record.get("host", "")),
                pid=int(record.get("pid", 0)),
                process_start=str(record.get("process_start", "")),
                boot=str(record.get("boot", "")),
                pid_namespace=int(record.get("pid_namespace", 0)),
                renewed_at=float(record["renewed_at"]),
                renewals=int(record.get("renewals", 0)),
                lease_seconds=float(record.get("lease_seconds", DEFAULT_LEASE_SECONDS)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        age = max(0.0, time.time() - self.renewed_at)
        return f"process {self.pid} on {self.host}, renewed {age:.0f} s ago"


class BackupLease:
    """The lease on one backup directory, held by this process's chief.

    Args:
        backup_dir: The directory.
        job: `job_identity(...)` of this job.
        fingerprint: A digest of this run's fingerprint.
        lease_seconds: How long a lease lasts without renewal; renewed six
            times as often.
    """

    def __init__(self, backup_dir: str, *, job: str, fingerprint: str, lease_seconds: float):
        self.backup_dir = backup_dir.rstrip("/") or "/"
        self.path = f"{self.backup_dir}/{LEASE_NAME}"
        self.lease_seconds = float(lease_seconds)
        self._me = {
            "owner": uuid.uuid4().hex,
            "job": job,
            "fingerprint": fingerprint,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "process_start": process_start(os.getpid()) or "",
            "boot": _read_text("/proc/sys/kernel/random/boot_id") or "",
            "pid_namespace": _pid_namespace(),
            "lease_seconds": self.lease_seconds,
        }
        self._renewals = 0
        self._held = False
        self._lost: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------- reading

    def read(self) -> Holder | None:
        """The current holder, or None when there is no (readable) lease."""
        try:
            if not tf.io.gfile.exists(self.path):
                return None
            with tf.io.gfile.GFile(self.path, "rb") as handle:
                return Holder.parse(json.loads(handle.read()))
        except (ValueError, tf.errors.OpError):
            return None

    def _is_mine(self, holder: Holder | None) -> bool:
        return holder is not None and holder.owner == self._me["owner"]

    def _same_host(self, holder: Holder) -> bool:
        me = self._me
        return (
            holder.host == me["host"]
            and holder.boot == me["boot"]
            and holder.pid_namespace == me["pid_namespace"]
            and bool(me["boot"])
        )

    def _why_free(self, holder: Holder) -> str | None:
        """Why this job may take over `holder`'s lease at once; None if it may not (yet)."""
        me = self._me
        if holder.job and holder.job == me["job"] and holder.fingerprint == me["fingerprint"]:
            return "a restart of the same job"
        if self._same_host(holder):
            start = process_start(holder.pid)
            if start is None or start != holder.process_start:
                return f"its process {holder.pid} on this host is gone"
            if holder.pid == me["pid"]:
                return "an earlier owner in this same process"
        if time.time() - holder.renewed_at > holder.lease_seconds:
            return f"it expired (not renewed for {holder.lease_seconds:.0f} s)"
        return None

    def _refuse(self, holder: Holder) -> BackupInUseError:
        return BackupInUseError(
            f"{self.backup_dir} is in use by another job: {LEASE_NAME} is held by "
            f"{holder.describe()}; two jobs on one backup directory overwrite each other's "
            f"backups. Wait for that job to end or stop it, or use another backup directory "
            f"(a lease that is not renewed expires {holder.lease_seconds:.0f} s after its "
            f"last renewal; a restart of the same job takes over at once)"
        )

    # ------------------------------------------------------------ acquiring

    def acquire(self) -> None:
        """Takes the lease, waiting at most `lease_seconds` for an unknown owner's to expire.

        Raises:
            BackupInUseError: A live job holds it; nothing was written.
        """
        holder = self.read()
        if holder is not None and not self._is_mine(holder):
            reason = self._why_free(holder)
            if reason is None:
                if self._same_host(holder):
                    raise self._refuse(holder)  # a live process here: no need to wait
                reason = self._watch(holder)
            _log.warning(
                "Taking over the backup directory %s from %s: %s.",
                self.backup_dir,
                holder.describe(),
                reason,
            )
        self._write()
        current = self.read()
        if not self._is_mine(current):
            raise self._refuse(current) if current else self._lost_error()
        self._held = True
        atexit.register(self.release)
        self._start_renewing()

    def _watch(self, holder: Holder) -> str:
        """Waits for `holder` to renew (refused) or to expire (returns why it is free)."""
        wait = max(0.0, holder.lease_seconds)
        _log.warning(
            "The backup directory %s is leased by %s; waiting up to %.0f s to see whether "
            "that job is alive (it renews its lease) or gone (the lease expires).",
            self.backup_dir,
            holder.describe(),
            wait,
        )
        deadline = time.monotonic() + wait
        poll = min(1.0, max(0.05, holder.lease_seconds / 30))
        while time.monotonic() < deadline:
            time.sleep(poll)
            current = self.read()
            if current is None:
                if not tf.io.gfile.exists(self.path):
                    return "its owner released it"
                continue  # being rewritten, or storage unreadable for a moment: watch on
            if current.owner != holder.owner or current.renewals != holder.renewals:
                raise self._refuse(current)
        return f"it expired (not renewed for {wait:.0f} s)"

    # ------------------------------------------------------------- renewing

    def _write(self) -> None:
        with self._lock:
            self._renewals += 1
            record = {**self._me, "renewed_at": time.time(), "renewals": self._renewals}
            tf.io.gfile.makedirs(self.backup_dir)
            write_json_atomically(self.path, record)

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._renew_until_stopped, name="tfdist-backup-lease", daemon=True
        )
        self._thread.start()

    def _renew_until_stopped(self) -> None:
        interval = self.lease_seconds / _RENEWALS_PER_LEASE
        while not self._stop.wait(interval):
            try:
                self.renew()
            except BackupInUseError:
                return
            except Exception as error:  # pylint: disable=broad-except  (storage hiccup: retry)
                _log.warning("Could not renew the lease on %s: %s", self.backup_dir, error)

    def renew(self) -> None:
        """Renews the lease; raises `BackupInUseError` if another job took it over."""
        if not self._held:
            return
        current = self.read()
        if current is not None and not self._is_mine(current):
            self._lost = current
            self._held = False
            self._stop.set()
            _log.error(
                "Lost the lease on %s to %s: this job stops before its next backup.",
                self.backup_dir,
                current.describe(),
            )
            raise self._lost_error()
        self._write()

    def check(self) -> None:
        """Before a backup: raises `BackupInUseError` if the lease was lost to another job."""
        if self._lost is not None:
            raise self._lost_error()
        self.renew()

    def _lost_error(self) -> BackupInUseError:
        who = self._lost.describe() if self._lost else "another job"
        return BackupInUseError(
            f"another job took over {self.backup_dir} ({LEASE_NAME} is now held by {who}); "
            f"this job stops without writing another backup: run one job per backup "
            f"directory, and give each job its own TFDIST_JOB_ID if you set one"
        )

    def release(self) -> None:
        """Stops renewing and removes the lease if it is still this job's; idempotent."""
        self._stop.set()
        atexit.unregister(self.release)
        if not self._held:
            return
        self._held = False
        try:
            if self._is_mine(self.read()):
                tf.io.gfile.remove(self.path)
        except tf.errors.OpError as error:
            _log.warning("Could not remove the lease %s: %s", self.path, error)
