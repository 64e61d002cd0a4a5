"""What marks a pass or history on the ``meta`` device (values-free), and the error for what
needs values. Low in the layers so that ``rerun`` and ``validate`` can refuse such histories."""

from __future__ import annotations

from typing import Protocol, Sequence

from ...errors import TorchlensError

META_NOTE = "This pass ran on the meta device"


class MetaDeviceError(TorchlensError, ValueError):
    """An operation needs tensor values, and the pass (or history) is on the ``meta`` device.

    Example:
        >>> import torchlens as tl
        >>> issubclass(tl.MetaDeviceError, tl.TorchlensError), issubclass(tl.MetaDeviceError, ValueError)
        (True, True)
    """


class Noted(Protocol):
    """What ``is_meta_history`` reads of a history (live or loaded): its notes."""

    @property
    def notes(self) -> Sequence[str]: ...


def is_meta_history(history: Noted) -> bool:
    """Whether ``history`` was traced on the meta device: its note (activations are not looked
    at: a loaded history would read every one from disk)."""
    return any(note.startswith(META_NOTE) for note in history.notes)


def refuse_meta(what: str) -> MetaDeviceError:
    """The error for ``what`` (validation, rerun, ...) asked of a meta pass or history."""
    return MetaDeviceError(
        f"{what} needs tensor values, and this model or history is on the meta device, which has shapes and "
        "dtypes but no values. Run it with real weights and a small real input instead (e.g. the same config "
        "with fewer layers or a shorter sequence, built without torch.device('meta'))."
    )


__all__ = ["META_NOTE", "MetaDeviceError", "is_meta_history", "refuse_meta"]
