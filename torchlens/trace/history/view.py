"""``HistoryView``: what the summary, the attention lookup and the meta check read of a history.

``ModelHistory`` imports the modules that print it and find its attention, so they cannot
import it back; they take this protocol instead, which ``ModelHistory`` (and a loaded history,
a subclass) satisfies by its attributes and properties.

Example:
    >>> import torch, torchlens as tl
    >>> def layer_count(history: HistoryView) -> int:
    ...     return len(history.layer_list)
    >>> layer_count(tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2)))
    3
"""

from __future__ import annotations

from typing import Dict, List, Protocol, Sequence, Tuple

import torch

from ..records.tensor_log import TensorLogEntry
from .module_info import ModuleInfo


class HistoryView(Protocol):
    """The read-only face of a ``ModelHistory`` that its own helper modules use."""

    def __len__(self) -> int: ...

    @property
    def layer_list(self) -> List[TensorLogEntry]: ...

    @property
    def modules(self) -> ModuleInfo: ...

    @property
    def param_info(self) -> Dict[str, Tuple[torch.Size, int, int]]: ...

    @property
    def model_name(self) -> str: ...

    @property
    def notes(self) -> Sequence[str]: ...

    @property
    def random_seed(self) -> int: ...

    @property
    def pass_time(self) -> float: ...

    @property
    def postprocess_time(self) -> float: ...

    @property
    def elapsed_time(self) -> float: ...

    @property
    def max_passes(self) -> int: ...

    @property
    def is_recurrent(self) -> bool: ...

    @property
    def is_branching(self) -> bool: ...

    @property
    def has_conditional_branching(self) -> bool: ...

    @property
    def num_tensors(self) -> int: ...

    @property
    def tensor_bytes(self) -> int: ...

    @property
    def num_tensors_saved(self) -> int: ...

    @property
    def saved_tensor_bytes(self) -> int: ...

    @property
    def num_param_tensors(self) -> int: ...

    @property
    def num_param_operations(self) -> int: ...

    @property
    def num_params(self) -> int: ...

    @property
    def param_bytes(self) -> int: ...

    @property
    def untraced_layers(self) -> List[str]: ...


__all__ = ["HistoryView"]
