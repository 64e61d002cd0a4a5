"""Which tensors a pass copies, and how (device, detach, post-function)."""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, Optional, Tuple, Union

import torch

from ..records.tensor_log import TensorLogEntry


class SavePlan:
    """Decides during the pass whether a tensor's activation is saved, and how.

    ``raw_indices`` (positions in execution order) is used by the second pass of a two-pass
    request; ``type_substrings``, ``modules`` and ``addresses`` (of inputs, outputs and
    buffers) are requests that can be resolved during the pass itself.
    """

    def __init__(
        self,
        save_all: bool = False,
        raw_indices: Optional[FrozenSet[int]] = None,
        type_substrings: Tuple[str, ...] = (),
        modules: FrozenSet[Union[str, Tuple[str, int]]] = frozenset(),
        addresses: FrozenSet[str] = frozenset(),
        output_device: Union[str, torch.device] = "same",
        activation_postfunc: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        detach: bool = False,
    ) -> None:
        self.save_all = save_all
        self.raw_indices = raw_indices or frozenset()
        self.type_substrings = type_substrings
        self.modules = modules
        self.addresses = addresses
        self.device = None if output_device in (None, "same") else torch.device(output_device)
        self.postfunc = activation_postfunc
        self.detach = detach
        self.postfunc_error: Optional[BaseException] = None  # the error the postfunc raised, if any
        self.intervention: Any = None  # torchlens.trace.intervene.Interventions of this pass, if any
        self.memory: Any = None  # capture.memory.MemoryCheck: adds up the saved bytes, if set
        self.copy_at_once = False  # True: never keep an activation uncopied (see capture/shared.py)
        # log_forward_pass(decompose=...): wrapped function name -> chooser of what runs (capture/decompose.py)
        self.decompositions: Dict[str, Callable[[Callable, tuple, dict], Callable]] = {}

    # subclasses that write activations elsewhere (save_to) say False
    keeps_tensors = True
    # an object whose before_write(tensor) is called before a logged call writes into tensor
    # (in place or out=); find_nonfinite copies a parameter there, the first time it is written
    write_watcher: Any = None

    @property
    def can_share(self) -> bool:
        """Saved activations may stay uncopied until written (copy on write, capture/shared.py):
        not when they go to another device or through a function, which copies anyway."""
        return self.keeps_tensors and not self.copy_at_once and self.device is None and self.postfunc is None

    @property
    def saves_nothing(self) -> bool:
        return not (self.save_all or self.raw_indices or self.type_substrings or self.modules or self.addresses)

    def wants(self, entry: TensorLogEntry) -> bool:
        if self.save_all or entry.raw_index in self.raw_indices:
            return True
        if entry.address is not None and entry.address in self.addresses:
            return True
        if not self.type_substrings:
            return False
        layer_type = entry.layer_type
        return any(s in layer_type for s in self.type_substrings)

    def wants_module(self, address: str, pass_num: int) -> bool:
        return address in self.modules or (address, pass_num) in self.modules

    def copy(self, tensor: torch.Tensor, entry: Optional[TensorLogEntry] = None) -> torch.Tensor:
        """A copy that later in-place operations cannot change (``entry``: whose it is, named
        in the note added to an error of ``activation_postfunc``)."""
        source = tensor.detach() if self.detach else tensor
        saved = source.clone() if self.device is None else source.to(self.device, copy=True)
        if self.postfunc is not None:
            try:
                saved = self.postfunc(saved)
            except Exception as error:  # the user's function: keep its error, say where it failed
                self.postfunc_error = error
                add_note(error, self._postfunc_note(error, tensor, entry))
                raise
        return saved

    def _postfunc_note(self, error: BaseException, tensor: torch.Tensor, entry: Optional[TensorLogEntry]) -> str:
        name = getattr(self.postfunc, "__qualname__", None) or repr(self.postfunc)
        what = "a saved tensor"
        if entry is not None:
            what = f"layer '{entry.layer_type}' (operation #{entry.raw_index + 1} of the pass"
            if entry.module_stack:
                what += f", inside module '{entry.module_stack[-1][0]}'"
            if entry.call_frames:
                code, line, _ = entry.call_frames[-1]
                what += f", called at {code.co_filename}:{line}"
            what += ")"
        return (
            f"torchlens: activation_postfunc {name} raised {type(error).__name__} on the output of {what}, "
            f"a tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype}. The model itself ran fine up "
            "to there: fix the function (it receives a copy of every saved activation) or pass "
            "activation_postfunc=None."
        )


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python < 3.11, appended to the message."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{note}",) + error.args[1:]
