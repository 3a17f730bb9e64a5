"""`tfdist._internal.files`: the one atomic write (strict JSON, bytes, a writer callable), or nothing."""

import json

import pytest

from tfdist._internal.files import replace_atomically, write_atomically, write_json_atomically


def test_round_trip_is_strict_json(tmp_path):
    path = str(tmp_path / "summary.json")
    write_json_atomically(path, {"final_loss": 0.25, "metrics": {"accuracy": 1.0}})
    with open(path) as handle:
        assert json.loads(handle.read(), parse_constant=pytest.fail) == {
            "final_loss": 0.25,
            "metrics": {"accuracy": 1.0},
        }


@pytest.mark.parametrize(
    "payload, where",
    [
        ({"final_loss": float("nan")}, "final_loss"),
        ({"metrics": {"auc": float("inf")}}, "metrics.auc"),
        ({"history": [1.0, float("-inf")]}, "history.1"),
    ],
)
def test_non_finite_numbers_are_refused_and_the_old_file_stays(tmp_path, payload, where):
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}\n')
    with pytest.raises(ValueError, match=f"{where} is not a finite number"):
        write_json_atomically(str(path), payload)
    assert path.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("scheme", ["", "ram://"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, scheme):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    directory = f"ram://{tmp_path.name}" if scheme else str(tmp_path)
    tf.io.gfile.makedirs(directory)
    path = f"{directory}/model.keras"
    write_atomically(path, b"old")

    def fail(temporary):
        write_atomically(temporary, b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_atomically(path, fail, suffix=".keras")
    with tf.io.gfile.GFile(path, "rb") as handle:
        assert handle.read() == b"old"
    assert tf.io.gfile.listdir(directory) == ["model.keras"]
    write_atomically(path, "new")
    with tf.io.gfile.GFile(path, "rb") as handle:
        assert handle.read() == b"new"
    assert tf.io.gfile.listdir(directory) == ["model.keras"]
