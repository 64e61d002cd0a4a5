"""Automatic garbage collection paused while a pass runs and its history is built (a traced
pass: ``automatic_collection_paused``), or while a logged training forward runs (the watch:
``CollectionPause``, opened and closed by the model's hooks).

A collection in the middle of a pass finds the pass's records alive (they are, until the
history is dropped) and promotes them towards the oldest generation; the full collections that
many promoted objects then trigger walk every object of the process. In a process holding
torch and transformers that is ~250 ms a collection, on average about half the time of a small
model's trace, and it grows with the process, not the model. Paused, a pass's short-lived
objects die young, as in a plain forward.

Nothing is moved between generations (unlike ``gc.freeze``), explicit ``gc.collect()`` calls
still collect, and the collector is enabled again on the way out exactly when it was enabled
on the way in (nested pauses leave it to the outermost).

Example:
    >>> import gc
    >>> with automatic_collection_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator, Optional


@contextlib.contextmanager
def automatic_collection_paused() -> Iterator[None]:
    """Disable automatic collection inside the block; restore it after, whatever happens."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CollectionPause:
    """Automatic collection paused from ``pause`` to ``resume``, for a window that opens and
    closes in different hooks (a logged forward pass: the model's pre-hook, then its post-hook),
    where a ``with`` block cannot span it. ``resume`` enables the collector again exactly when
    ``pause`` found it enabled; both do nothing a second time.

    Example:
        >>> import gc
        >>> window = CollectionPause()
        >>> window.pause(); window.pause(); gc.isenabled()
        False
        >>> window.resume(); window.resume(); gc.isenabled()
        True
    """

    def __init__(self) -> None:
        self._was_enabled: Optional[bool] = None  # None: not paused

    def pause(self) -> None:
        if self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()

    def resume(self) -> None:
        was, self._was_enabled = self._was_enabled, None
        if was:
            gc.enable()


__all__ = ["CollectionPause", "automatic_collection_paused"]
