"""`tfdist.files.write_json_atomically` writes strict JSON or nothing."""

import json

import pytest

from tfdist.files import write_json_atomically


def test_round_trip_is_strict_json(tmp_path):
    path = str(tmp_path / "summary.json")
    write_json_atomically(path, {"final_loss": 0.25, "metrics": {"accuracy": 1.0}})
    with open(path) as handle:
        assert json.loads(handle.read(), parse_constant=pytest.fail) == {
            "final_loss": 0.25, "metrics": {"accuracy": 1.0}}


@pytest.mark.parametrize("payload, where", [
    ({"final_loss": float("nan")}, "final_loss"),
    ({"metrics": {"auc": float("inf")}}, "metrics.auc"),
    ({"history": [1.0, float("-inf")]}, "history.1"),
])
def test_non_finite_numbers_are_refused_and_the_old_file_stays(tmp_path, payload, where):
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}\n')
    with pytest.raises(ValueError, match=f"{where} is not a finite number"):
        write_json_atomically(str(path), payload)
    assert path.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
