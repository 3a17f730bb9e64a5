"""What a resumed run must end with, as the uninterrupted run: every variable and counter.

`write(model, history, directory)` writes `directory/weights.npz` (every variable of the
model, and of each optimizer it holds as an attribute, by role and position: a GAN's
`d_optimizer` and `g_optimizer` as much as a compiled `optimizer`) and
`directory/result.json` (each of those optimizers' iterations, the state of each
`keras.random.SeedGenerator` attribute, the `History`), through
`tfdist.resumable.write_path`: on a cluster only the chief's land there.
"""

import json
import pathlib

import keras
import numpy as np

import tfdist.resumable


def _attributes(model: keras.Model, kind: type) -> list[tuple[str, object]]:
    return sorted((name, value) for name, value in vars(model).items() if isinstance(value, kind))


def state_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
    for name, optimizer in _attributes(model, keras.optimizers.Optimizer):
        for i, variable in enumerate(optimizer.variables):
            arrays[f"{name}/{i}"] = np.asarray(variable.numpy())
    return arrays


def summary(model: keras.Model, history: keras.callbacks.History) -> dict:
    optimizers = _attributes(model, keras.optimizers.Optimizer)
    generators = _attributes(model, keras.random.SeedGenerator)
    return json.loads(
        json.dumps(
            {
                "iterations": {name: int(o.iterations.numpy()) for name, o in optimizers},
                "seed_states": {name: [int(x) for x in g.state.numpy()] for name, g in generators},
                "history": history.history,
            },
            default=float,
        )
    )


def write(model: keras.Model, history: keras.callbacks.History, directory) -> dict:
    """Writes both files (see the module); returns what result.json holds."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    result = summary(model, history)
    path = pathlib.Path(tfdist.resumable.write_path(str(directory / "result.json")))
    path.write_text(json.dumps(result, indent=1))
    np.savez(tfdist.resumable.write_path(str(directory / "weights.npz")), **state_arrays(model))
    return result


def read(directory) -> tuple[dict, dict[str, np.ndarray]]:
    directory = pathlib.Path(directory)
    with np.load(directory / "weights.npz") as data:
        arrays = {name: data[name] for name in data.files}
    return json.loads((directory / "result.json").read_text()), arrays


def assert_same_end(directory, reference, *, steps: int, optimizers: tuple[str, ...]) -> None:
    """The run in `directory` ended exactly where the one in `reference` did, `steps` applied."""
    result, got = read(directory)
    expected, want = read(reference)
    assert [expected["iterations"][name] for name in optimizers] == [steps] * len(optimizers)
    assert result == expected
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def saved_weights(model_dir: pathlib.Path) -> dict[str, np.ndarray]:
    """Every variable in model.keras by its path in the weights file (no class needed)."""
    import io  # pylint: disable=g-import-not-at-top
    import zipfile  # pylint: disable=g-import-not-at-top

    import h5py  # pylint: disable=g-import-not-at-top

    with zipfile.ZipFile(model_dir / "model.keras") as archive:
        data = archive.read("model.weights.h5")
    found = {}
    with h5py.File(io.BytesIO(data), "r") as weights:
        weights.visititems(
            lambda name, item: (
                found.__setitem__(name, np.array(item)) if isinstance(item, h5py.Dataset) else None
            )
        )
    return found
