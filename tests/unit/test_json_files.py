"""Every JSON file a program reads goes through one reader (`read_json_file`), so each way a
file can be wrong is the same one line through every caller: `--config` (trainer.task),
`--job_config` / `--hparam_tuning` / `--check`'s JSON objects (trainer.submission) and the
packaged Vertex AI tables. The line names the file, says what was wrong with it (its size,
where the JSON breaks) and how to fix it; what the value must hold stays each caller's.

On main `--config` called a directory (or `/dev/zero`) missing, said a 5 MB file "is 1048577
bytes" (what it had read, not the file), and a missing table "cannot be read"."""

import os

import pytest

from tfdist.errors import UsageError
from trainer import config as config_lib
from trainer import submission
from trainer.vertex import machines, tables

JOB_EXAMPLE = "configs/jobs/mirrored_1x8_gpu.json"


def _config(path):
    return config_lib.load_config_file(str(path))


def _job_config(path):
    return submission.read_json_object(
        str(path), flag="--job_config", keys=("machine_type",), example=JOB_EXAMPLE
    )


def _table(path):
    return tables.read(path, machines.SHAPE, machines.check_table)


# caller, how its lines start for a path, the fix for no file, the fix for a wrong file
CALLERS = {
    "--config": (
        _config,
        lambda path: f"--config file {str(path)!r} ",
        "check the path (e.g. configs/default.json)",
        "expected a JSON object of field names to values",
    ),
    "--job_config": (
        _job_config,
        lambda path: f"--job_config file {str(path)!r} ",
        f"check the path (e.g. {JOB_EXAMPLE})",
        f"expected a small JSON object of option names to values such as {JOB_EXAMPLE}",
    ),
    "Vertex AI table": (
        _table,
        lambda path: f"Vertex AI table {path} ",
        "the package ships it: reinstall tfdist",
        "fix the file (trainer/vertex/tables/__init__.py describes the tables)",
    ),
}
CAP = 1 << 20  # every caller's cap: config files, job configs and tables are small


def _missing(tmp_path):
    return tmp_path / "nope.json"


def _directory(tmp_path):
    (tmp_path / "configs.json").mkdir()
    return tmp_path / "configs.json"


def _unreadable(tmp_path):  # the tests run as root, so a mode of 000 would not stop a read
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    return loop


def _written(content):
    def write(tmp_path):
        path = tmp_path / "file.json"
        path.write_bytes(content)
        return path

    return write


# failure, the file, what the line says, whether the fix is the no-file one
FAILURES = {
    "missing": (_missing, "does not exist, expected a JSON file", True),
    "a directory": (_directory, "is a directory, expected a JSON file", True),
    "unreadable": (
        _unreadable,
        "cannot be read (Too many levels of symbolic links), expected a readable JSON file",
        True,
    ),
    "over the cap": (
        _written(b"[" + b" " * 5 * CAP + b"]"),
        f"is larger than {CAP} bytes, expected a JSON file of at most {CAP} bytes",
        False,
    ),
    "not JSON": (
        _written(b'{"epochs": 2,}'),
        "is not valid JSON (Expecting property name enclosed in double quotes at line 1 column 14)",
        False,
    ),
    "not strict JSON": (
        _written(b'{"epochs": NaN}'),
        "is not accepted JSON (NaN is not a number JSON allows; expected a finite number)",
        False,
    ),
    "a duplicated key": (
        _written(b'{"epochs": 2, "epochs": 3}'),
        "is not accepted JSON (key 'epochs' appears twice; expected each key once)",
        False,
    ),
    "not UTF-8": (
        _written(b'{"epochs": "\xff"}'),
        "is not UTF-8 (byte 12), expected JSON text",
        False,
    ),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_each_failure_is_one_line_naming_the_file_what_was_wrong_and_the_fix(
    tmp_path, caller, failure
):
    read, starts, no_file_fix, wrong_file_fix = CALLERS[caller]
    make, says, no_file = FAILURES[failure]
    path = make(tmp_path)
    with pytest.raises(UsageError) as raised:
        read(path)
    message = str(raised.value)
    fix = no_file_fix if no_file else wrong_file_fix
    assert message == f"{starts(path)}{says}; {fix}"


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_a_device_is_read_no_further_than_the_cap(caller):
    """`/dev/zero` never ends: the reader stops at the cap and says so."""
    read, starts, _, wrong_file_fix = CALLERS[caller]
    with pytest.raises(UsageError) as raised:
        read("/dev/zero")
    assert str(raised.value).startswith(f"{starts('/dev/zero')}is larger than {CAP} bytes")
    assert str(raised.value).endswith(wrong_file_fix)


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_a_file_at_the_cap_is_read(tmp_path, caller):
    """The cap is inclusive: a file of exactly `CAP` bytes is parsed, not refused for size."""
    read, starts, _, _ = CALLERS[caller]
    path = tmp_path / "file.json"
    path.write_bytes(b"[" + b" " * (CAP - 2) + b"]")
    assert os.path.getsize(path) == CAP
    with pytest.raises(UsageError) as raised:  # a list is no caller's object: their own check
        read(path)
    assert str(raised.value).startswith(starts(path).rstrip())
    assert "larger than" not in str(raised.value) and "not valid JSON" not in str(raised.value)
