"""The state of Keras callbacks, saved with every backup and restored on resume.

Keras callbacks keep their state in Python attributes (`EarlyStopping.wait`,
`ReduceLROnPlateau.cooldown_counter`, `ModelCheckpoint.best`, ...), which a
restarted process loses, and every `fit` call's `on_train_begin` resets. This
module reads that state from a list of callbacks and writes it back.

The protocol for your own callbacks: define both

    def get_state(self) -> dict: ...          # JSON values and numpy arrays
    def set_state(self, state: dict) -> None: ...

`get_state` is called at every backup, `set_state` before training continues
(after `on_train_begin`, so a reset there does not undo it). Keras's own
stateful callbacks are handled here without it; a callback that neither
defines the protocol nor is known, and whose attributes change while it
trains, gets one logged warning.
"""

import io
import logging

import keras
import numpy as np
import tensorflow as tf

from tfdist.errors import UsageError

__all__ = ["ARRAYS_FILE", "CallbackStates", "arrays_to_bytes", "arrays_from_file"]

_log = logging.getLogger(__name__)
ARRAYS_FILE = "callbacks.npz"
_ARRAY_KEY = "__tfdist_array__"

# Keras callbacks whose behaviour on resume depends on nothing they hold.
_STATELESS = (
    keras.callbacks.History,
    keras.callbacks.ProgbarLogger,
    keras.callbacks.TerminateOnNaN,
    keras.callbacks.LambdaCallback,
    keras.callbacks.LearningRateScheduler,
    keras.callbacks.RemoteMonitor,
    keras.callbacks.TensorBoard,
)


def _number(value):
    return None if value is None else float(np.asarray(value))


def _early_stopping_state(callback) -> dict:
    return {
        "wait": int(callback.wait),
        "stopped_epoch": int(callback.stopped_epoch),
        "best": _number(callback.best),
        "best_epoch": int(getattr(callback, "best_epoch", 0)),
        "best_weights": (
            None
            if callback.best_weights is None
            else [np.asarray(w) for w in callback.best_weights]
        ),
    }


def _set_early_stopping_state(callback, state: dict) -> None:
    callback.wait, callback.stopped_epoch = state["wait"], state["stopped_epoch"]
    callback.best, callback.best_epoch = state["best"], state["best_epoch"]
    callback.best_weights = state["best_weights"]


def _plateau_state(callback) -> dict:
    return {
        "wait": int(callback.wait),
        "cooldown_counter": int(callback.cooldown_counter),
        "best": _number(callback.best),
    }


def _set_plateau_state(callback, state: dict) -> None:
    callback.wait, callback.cooldown_counter = state["wait"], state["cooldown_counter"]
    callback.best = state["best"]


def _checkpoint_state(callback) -> dict:
    return {"best": _number(callback.best)}


def _set_checkpoint_state(callback, state: dict) -> None:
    callback.best = state["best"]


def _file_size(path: str) -> int | None:
    return tf.io.gfile.stat(path).length if tf.io.gfile.exists(path) else None


def _csv_state(callback) -> dict:
    return {"bytes": _file_size(callback.filename)}


def _set_csv_state(callback, state: dict) -> None:
    """Nothing to set after `on_train_begin`: `prepare_csv` ran before it."""


_KNOWN = (
    (keras.callbacks.EarlyStopping, _early_stopping_state, _set_early_stopping_state),
    (keras.callbacks.ReduceLROnPlateau, _plateau_state, _set_plateau_state),
    (keras.callbacks.ModelCheckpoint, _checkpoint_state, _set_checkpoint_state),
    (keras.callbacks.CSVLogger, _csv_state, _set_csv_state),
)


def _handlers(callback):
    """`(get, set)` for `callback`, or None when it has no state tfdist knows of."""
    if callable(getattr(callback, "get_state", None)) and callable(
        getattr(callback, "set_state", None)
    ):
        return type(callback).get_state, type(callback).set_state
    for cls, getter, setter in _KNOWN:
        if isinstance(callback, cls):
            return getter, setter
    return None


def _keys(callbacks) -> list[str]:
    """A name per callback, not shifted by others: `EarlyStopping`, `EarlyStopping#1`."""
    seen: dict[str, int] = {}
    keys = []
    for callback in callbacks:
        name = type(callback).__name__
        count = seen.get(name, 0)
        seen[name] = count + 1
        keys.append(f"{name}#{count}" if count else name)
    return keys


def _encode(value, arrays: dict, where: str):
    """`value` as JSON, its numpy arrays moved to `arrays`."""
    if isinstance(value, np.ndarray):
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {_ARRAY_KEY: name}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise UsageError(
                f"{where} has a key that is not a string, expected a dict with "
                f"string keys; convert the keys with str()"
            )
        return {key: _encode(item, arrays, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(item, arrays, f"{where}[{i}]") for i, item in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UsageError(
        f"{where} is a {type(value).__name__}, which a backup cannot hold; "
        f"expected JSON values (numbers, strings, lists, dicts) or numpy arrays"
    )


def _decode(value, arrays):
    if isinstance(value, dict):
        if set(value) == {_ARRAY_KEY}:
            return arrays[value[_ARRAY_KEY]]
        return {key: _decode(item, arrays) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item, arrays) for item in value]
    return value


def _public_attributes(callback) -> dict:
    return {
        name: value
        for name, value in vars(callback).items()
        if not name.startswith("_") and name not in ("model", "params", "validation_data")
    }


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, (bool, int, float, str)) and isinstance(b, (bool, int, float, str)):
        return a == b
    return False


class CallbackStates:
    """Reads and writes the state of the callbacks that run beside a backup.

    Args:
        callbacks: The callbacks passed to every `fit` call, in order.
    """

    def __init__(self, callbacks):
        self.callbacks = list(callbacks or [])
        self._pending: dict | None = None
        self._initial = {}
        self._warned = set()
        for index, callback in enumerate(self.callbacks):
            if _handlers(callback) is None and not isinstance(callback, _STATELESS):
                self._initial[index] = dict(_public_attributes(callback))

    # ------------------------------------------------------------ capture

    def capture(self) -> tuple[dict, dict]:
        """`(json_state, arrays)` of every callback that has state."""
        state, arrays = {}, {}
        for key, callback in zip(_keys(self.callbacks), self.callbacks):
            handlers = _handlers(callback)
            if handlers is None:
                continue
            value = handlers[0](callback)
            if not isinstance(value, dict):
                raise UsageError(
                    f"{type(callback).__name__}.get_state() returned a "
                    f"{type(value).__name__}, expected a dict"
                )
            state[key] = _encode(value, arrays, f"{type(callback).__name__}.get_state()[{key!r}]")
        self._warn_unknown()
        return state, arrays

    def _warn_unknown(self) -> None:
        for index, before in self._initial.items():
            if index in self._warned:
                continue
            callback = self.callbacks[index]
            now = _public_attributes(callback)
            changed = sorted(
                name
                for name in set(before) | set(now)
                if not _same(before.get(name), now.get(name))
            )
            if changed:
                self._warned.add(index)
                _log.warning(
                    "Callback %s changed %s while training, which tfdist cannot save: a "
                    "resumed run starts it afresh. Define get_state() -> dict and "
                    "set_state(dict) on it to keep its state across a resume (see "
                    "docs/fault_tolerance.md).",
                    type(callback).__name__,
                    ", ".join(changed),
                )

    # ------------------------------------------------------------ restore

    def remember(self, state: dict | None, arrays: dict | None = None) -> None:
        """Holds a state for `restore_pending` (after the next `on_train_begin`)."""
        self._pending = None if state is None else _decode(state, arrays or {})

    def remember_current(self) -> None:
        """Holds the callbacks' present state for the next `fit` call of this process."""
        state, arrays = self.capture()
        self.remember(state, arrays)

    def restore_pending(self) -> None:
        """Writes the held state back into the callbacks, once."""
        state, self._pending = self._pending, None
        if state is None:
            return
        restored = set()
        for key, callback in zip(_keys(self.callbacks), self.callbacks):
            handlers = _handlers(callback)
            if handlers is None:
                continue
            if key not in state:
                _log.warning(
                    "The backup holds no state for callback %s (added since?): it starts afresh.",
                    key,
                )
                continue
            handlers[1](callback, state[key])
            restored.add(key)
        for key in sorted(set(state) - restored):
            _log.warning(
                "The backup holds the state of callback %s, which this run does not have; ignored.",
                key,
            )

    # ---------------------------------------------------------------- CSV

    def prepare_csv(self, state: dict | None, *, is_chief: bool) -> None:
        """Before `fit` on resume: CSV logs cut back to the backup and appended to."""
        for key, callback in zip(_keys(self.callbacks), self.callbacks):
            if not isinstance(callback, keras.callbacks.CSVLogger):
                continue
            callback.append = True
            saved = (state or {}).get(key, {}).get("bytes")
            size = _file_size(callback.filename)
            if saved is None or size is None or size < saved:
                if is_chief and saved:
                    _log.warning(
                        "%s has %s bytes but had %d at the backup; appending to it as it is.",
                        callback.filename,
                        size,
                        saved,
                    )
                continue
            if size > saved:
                with tf.io.gfile.GFile(callback.filename, "rb") as handle:
                    kept = handle.read(saved)
                with tf.io.gfile.GFile(callback.filename, "wb") as handle:
                    handle.write(kept)
                _log.info(
                    "Cut %s back to the %d bytes it had at the backup (rows of "
                    "steps that run again).",
                    callback.filename,
                    saved,
                )

    def keep_appending_csv(self) -> None:
        """Between two `fit` calls of one run: the next one appends."""
        for callback in self.callbacks:
            if isinstance(callback, keras.callbacks.CSVLogger):
                callback.append = True


def arrays_to_bytes(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def arrays_from_file(path: str) -> dict:
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path, "rb") as handle:
        with np.load(io.BytesIO(handle.read()), allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
