"""What a pass saves: which activations, how they are copied (device, detach, post-function),
and whether each call's arguments and the gradients are kept too."""

from __future__ import annotations

from typing import Callable, FrozenSet, Optional, Tuple, Union

import torch

from ..records.tensor_log import TensorLogEntry


class SavePlan:
    """Decides during the pass whether a tensor's activation is saved, and how.

    ``raw_indices`` (positions in execution order) is used by the second pass of a two-pass
    request; ``type_substrings``, ``modules`` and ``addresses`` (of inputs, outputs and
    buffers) are requests that can be resolved during the pass itself. ``save_function_args``
    keeps each call's arguments (for replays); ``save_gradients`` records each saved tensor's
    gradient when backward runs through it. Everything else a feature adds to a pass is a
    ``PassHook`` (capture/hooks.py), not part of the plan.
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
        save_function_args: bool = False,
        save_gradients: bool = False,
    ) -> None:
        self.save_all = save_all
        self.raw_indices = raw_indices or frozenset()
        self.type_substrings = type_substrings
        self.modules = modules
        self.addresses = addresses
        self.device = None if output_device in (None, "same") else torch.device(output_device)
        self.postfunc = activation_postfunc
        self.detach = detach
        self.save_function_args = save_function_args
        self.save_gradients = save_gradients
        self.postfunc_error: Optional[BaseException] = None  # the error the postfunc raised, if any
        self.copy_at_once = False  # True: never keep an activation uncopied (see capture/copy_on_write.py)
        # whether the pass's caller gets the model's output (``PassResult.output``), and may write
        # into it: the saved activations it holds are then copied at the end of the pass
        self.hands_out_output = True

    # subclasses that write activations elsewhere (save_to) say False
    keeps_tensors = True

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


def has_torchlens_note(error: BaseException) -> bool:
    """The error already says what torchlens knows of it (a note added by ``add_note``)."""
    notes = getattr(error, "__notes__", None) or ()
    return any(isinstance(n, str) and n.startswith("torchlens:") for n in notes) or (
        bool(error.args) and isinstance(error.args[0], str) and "\ntorchlens:" in error.args[0]
    )


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python < 3.11, appended to the message."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{note}",) + error.args[1:]
