"""``EntryRow``: one ``TensorLogEntry`` as a flat row, the columns of ``ModelHistory.to_pandas``
and of the Parquet export (``TensorLogEntry.to_row`` makes it).

Example:
    >>> import torch, torchlens as tl
    >>> row: EntryRow = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))["linear_1_1"].to_row()
    >>> row["layer_type"], row["shape"], row["parent_layers"]
    ('linear', (1, 2), ['input_1_0'])
"""

from __future__ import annotations

from typing import List, Optional, Tuple, TypedDict


class EntryRow(TypedDict):
    """The metadata of one entry (layer pass), one value per column, in column order."""

    label: str
    layer_label: str
    layer_type: str
    type_index: int
    layer_index: int
    pass_num: int
    num_passes: int
    operation_num: int
    kind: str
    untraced_reason: Optional[str]
    address: Optional[str]
    func_name: str
    grad_fn_name: Optional[str]
    shape: Optional[Tuple[Optional[int], ...]]  # None for a nested tensor's ragged dimensions
    dtype: Optional[str]
    nbytes: int
    has_saved_activation: bool
    has_gradient: bool
    grad_shape: Optional[Tuple[int, ...]]
    grad_nbytes: int
    gradient_note: Optional[str]
    parent_layers: List[str]
    child_layers: List[str]
    param_addresses: List[str]
    num_params: int
    param_bytes: int
    containing_module: Optional[str]
    containing_modules: List[str]
    modules_output_of: List[str]
    is_inplace: bool
    created_inside_model: Optional[bool]
    bool_used: bool
    stored_as_buffer: Optional[str]
    branch_condition: Optional[str]
    elapsed: float
    intervened: Optional[str]


__all__ = ["EntryRow"]
