"""Whose completion record this is: a finished job's `COMPLETED.json`, checked before it is trusted.

A completion record says "this job is done, do not train again". It belongs to
one job, so it carries that job's run fingerprint (`fingerprint.RunFingerprint`)
and where the job's outputs went (e.g. `{"model_dir": "/runs/a"}`). A restart
reads it only after checking:

- the fingerprint: a job with other settings (another learning rate, model,
  seed, ...) is refused with `BackupMismatchError` (exit 2), as a mid-run
  mismatch is, and nothing is touched;
- the backups beside it: a finished job leaves either no backup (deleted) or
  its final backup at the recorded step. A record next to newer or only older
  backups was not written by the run that made them (copied in, or left by
  another job): refused in one line, nothing touched.

A record written by an older tfdist has no fingerprint: only the second check
applies, and the caller must check its outputs itself (`outputs` is empty).
"""

import dataclasses
from typing import Mapping, Sequence

from tfdist.backups.fingerprint import RunFingerprint, compare
from tfdist.errors import BackupMismatchError

__all__ = [
    "FINGERPRINT_KEY",
    "OUTPUTS_KEY",
    "Completion",
    "completion_metadata",
    "check_completion",
]

FINGERPRINT_KEY = "fingerprint"
OUTPUTS_KEY = "outputs"


@dataclasses.dataclass(frozen=True)
class Completion:
    """A completion record that passed its checks.

    Attributes:
        step: The step training completed at.
        outputs: Where the finished job wrote its outputs, as it recorded them
            (empty when it recorded none).
        fingerprint_checked: The record carried a fingerprint and it matches
            this run (False for a record of an older tfdist).
    """

    step: int
    outputs: Mapping[str, str]
    fingerprint_checked: bool


def completion_metadata(fingerprint: RunFingerprint, outputs: Mapping | None) -> dict:
    """What a completion record holds beside its step: the fingerprint and the outputs."""
    return {
        FINGERPRINT_KEY: fingerprint.to_json(),
        OUTPUTS_KEY: {str(key): str(value) for key, value in dict(outputs or {}).items()},
    }


def check_completion(
    record: Mapping,
    *,
    fingerprint: RunFingerprint,
    changeable: Mapping[str, str],
    backup_dir: str,
    committed_steps: Sequence[int],
) -> Completion:
    """Checks that `record` (a `COMPLETED.json`) belongs to this run and to the backups beside it.

    Raises:
        BackupMismatchError: The record was made with other settings, or does
            not belong to the backups in `backup_dir`; nothing was touched.
    """
    step = int(record["step"])
    user = record.get("user") if isinstance(record.get("user"), Mapping) else {}
    where = f"{backup_dir}/COMPLETED.json"
    saved = user.get(FINGERPRINT_KEY)
    if saved is not None:
        compare(
            RunFingerprint.from_json(saved, where=f"completion record {where}"),
            fingerprint,
            backup_dir=backup_dir,
            changeable=changeable,
        )
    if committed_steps and max(committed_steps) != step:
        newest = max(committed_steps)
        raise BackupMismatchError(
            f"{where} records that training completed at step {step}, but the newest "
            f"backup beside it is at step {newest}: the record was not written by the run "
            f"that made these backups (copied in, or left by another job); delete {where} "
            f"to resume from step {newest}, or use a new backup directory",
            field="completion step",
            backup_value=str(step),
            run_value=str(newest),
        )
    outputs = user.get(OUTPUTS_KEY)
    outputs = (
        {str(key): str(value) for key, value in outputs.items()}
        if isinstance(outputs, Mapping)
        else {}
    )
    return Completion(step=step, outputs=outputs, fingerprint_checked=saved is not None)
