"""A warning before saved activations outgrow the memory that is free.

Saved activations stay alive until the history is dropped, so a pass that saves everything can
need far more memory than a plain forward pass. Two checks, both exact rather than guessed:

- when a first, metadata-only pass ran (``layers_to_save`` by label, ``intervene``), the bytes
  of the layers the second pass will save are known before it starts: the warning comes then;
- in a single pass, the bytes saved so far are added up as each activation is saved (one
  addition per saved tensor) and the warning comes the moment they pass the memory that was
  free on that device when the pass started, before the machine runs out.

A guess from the parameter count before the pass is not used: activations scale with the input
(batch, image or sequence size), not with the parameters, so it would warn on a large model run
on a small input and stay silent on a small model run on a large one.

Free memory is ``MemAvailable`` of ``/proc/meminfo`` (psutil elsewhere, if installed) for the
CPU and ``torch.cuda.mem_get_info`` for a CUDA device; where neither is known, nothing is checked.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ...machine import available_memory
from ..records.format import human_bytes
from ..records.tensor_log import TensorLogEntry
from .args import tensors_in_call
from .hooks import PassHook, PassRecords
from .save_plan import SavePlan


class ActivationMemoryWarning(UserWarning):
    """The activations a pass saves do not fit in the memory that is free.

    Example:
        >>> issubclass(ActivationMemoryWarning, UserWarning)
        True
    """


_Tensor = torch.Tensor


def free_memory(device: torch.device) -> Optional[int]:
    """Bytes free on ``device`` now, or None where that cannot be told.

    Example:
        >>> free_memory(torch.device("cpu")) is None or free_memory(torch.device("cpu")) > 0
        True
    """
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0]
        except Exception:  # no driver, or the device is not usable from here
            return None
    if device.type != "cpu":
        return None
    return available_memory()


def _ways_out() -> str:
    return (
        "To keep memory low, pass save_to='folder' (each activation is written to disk as it is made), "
        "or save fewer layers with layers_to_save=[...] (or activation_postfunc to keep a reduction)."
    )


class MemoryCheck(PassHook):
    """Adds up the bytes of the activations saved in one pass, per device, and warns once when
    they pass what was free on that device when the pass started (see the module docstring).
    A pass hook: each pass it enters starts counting from zero."""

    def __init__(self, devices: Iterable[torch.device]) -> None:
        self.devices = set(devices)
        # read when a pass that saves starts, or before a planned one (``check_estimate``): a
        # pass saving nothing (``layers_to_save=None``) never reads it
        self.free: Dict[torch.device, int] = {}
        # what is left of ``free`` on each device, less the activations saved so far this pass
        self.left: Dict[torch.device, int] = {}
        self.warned = False

    @classmethod
    def for_pass(
        cls,
        held: Sequence[torch.Tensor],
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        output_device: Union[None, str, torch.device],
    ) -> "MemoryCheck":
        """A check for a pass of a model (its parameters and buffers: ``held``) on these
        inputs: on the devices its activations can be on."""
        if output_device not in (None, "same"):
            return cls([torch.device(output_device)])
        devices = {t.device for t in held}
        devices |= {t.device for _, t in tensors_in_call(args, kwargs)}
        return cls(devices | {torch.device("cpu")})

    def check_plan(self, entries: List[TensorLogEntry], plan: SavePlan) -> None:
        """Before the saving pass of a two-pass call: ``entries`` are the first pass's records,
        ``plan`` the ``SavePlan`` of the second. Checked when every tensor of the model and its
        inputs is on one device (else the device of each activation is not known beforehand)."""
        devices = self.devices - {torch.device("cpu")} or self.devices
        if len(devices) != 1:
            return
        device = next(iter(devices))
        nbytes = sum(
            e.nbytes or 0
            for e in entries
            if plan.wants(e) or any(plan.wants_module(a, p) for a, p in e.output_of_modules)
        )
        self.check_estimate({device: nbytes})

    def check_estimate(self, estimate: Dict[torch.device, int]) -> None:
        """Before a pass whose saved bytes per device are known (``estimate``): warn if they do
        not fit."""
        self.read_free()
        for device, nbytes in estimate.items():
            free = self.free.get(device)
            if free is not None and nbytes > free:
                self._warn(
                    f"this pass will save about {human_bytes(nbytes)} of activations on {device} (measured by a "
                    f"first, metadata-only pass), more than the {human_bytes(free)} free there; it may run out of "
                    f"memory. {_ways_out()}"
                )
                return

    def read_free(self) -> None:
        """What is free on each device now: the limit the saved bytes are checked against."""
        self.free = {}
        for device in self.devices:
            free = free_memory(device)
            if free is not None:
                self.free[device] = free

    def pass_started(self, records: PassRecords) -> None:
        self.read_free()
        self.left = dict(self.free)

    def on_save(self, entry: TensorLogEntry, value: object) -> None:
        """One activation was saved (called during the pass, only for saved activations)."""
        if self.warned or not isinstance(value, _Tensor):
            return
        device = value.device
        left = self.left.get(device)
        if left is None:  # what is free there cannot be told: nothing to check against
            return
        try:
            left -= value.nbytes  # a quarter of the time of nelement() * element_size()
        except Exception:  # a layout without plain storage (sparse, nested): not counted
            return
        self.left[device] = left
        if left < 0:
            free = self.free[device]
            self._warn(
                f"the activations saved so far in this pass hold {human_bytes(free - left)} on {device}, more than "
                f"the {human_bytes(free)} that was free there when the pass started; the pass may run out of memory "
                f"before it ends. {_ways_out()}"
            )

    def _warn(self, message: str) -> None:
        self.warned = True
        warnings.warn(f"torchlens: {message}", ActivationMemoryWarning, stacklevel=3)


__all__ = ["ActivationMemoryWarning", "MemoryCheck", "free_memory"]
