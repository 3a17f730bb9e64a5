"""Installs and removes replacements of Keras attributes, remembering the originals."""

import functools
import threading

_lock = threading.Lock()
# (owner, attribute name) -> the original attribute.
_originals: dict[tuple[object, str], object] = {}
_enabled: set[str] = set()


def install(owner, name: str, replacement) -> None:
    """Replaces `owner.name` with `replacement` once; later calls keep the first."""
    with _lock:
        if (owner, name) in _originals:
            return
        original = getattr(owner, name)
        _originals[(owner, name)] = original
        setattr(owner, name, functools.wraps(original)(replacement))


def original(owner, name: str):
    """The attribute `install` replaced (the current one when nothing was installed)."""
    return _originals.get((owner, name), getattr(owner, name))


def enable(correction: str) -> None:
    with _lock:
        _enabled.add(correction)


def enabled(correction: str) -> bool:
    return correction in _enabled


def any_enabled() -> bool:
    return bool(_enabled)


def remove_all() -> None:
    """Puts every original back and disables every correction."""
    with _lock:
        for (owner, name), value in _originals.items():
            setattr(owner, name, value)
        _originals.clear()
        _enabled.clear()
