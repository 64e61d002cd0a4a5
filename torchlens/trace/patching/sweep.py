"""``tl.patch_sweep``: the activation-patching grid (every layer x every position, optionally
x every head), from one trace of the run patched.

Each cell patches one layer at one position (and head) with the source's values and re-runs
only the operations downstream of that layer from the saved graph (``engine.Replayer``; the
set downstream of a layer is found once and reused for all its positions). The model itself is
run twice in all (the trace, and one plain call for the shape of its output), not once per cell.
"""

from __future__ import annotations

import re
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from ...arguments import check_arguments
from ..history.model_history import ModelHistory
from ..input_copy import as_args, as_kwargs, require_model
from .engine import Patch
from .grid import PatchGrid
from .select import PatchError, Selection
from .session import PatchSession, make_patches
from .sites import head_sites
from .targets import Target, resolve

Over = Union[str, Sequence[Union[str, int]]]
Each = Union[str, Sequence[int], None]


def patch_sweep(
    model: nn.Module,
    input_args: Any,
    *,
    source: ModelHistory,
    metric: Callable[[Any], Any],
    over: Over = "modules",
    positions: Each = "each",
    heads: Each = None,
    position_dim: int = 1,
    n_heads: Optional[int] = None,
    input_kwargs: Optional[Dict[str, Any]] = None,
    random_seed: Optional[int] = None,
    replay: bool = True,
    verify: bool = True,
) -> PatchGrid:
    """Patch each layer of ``over`` at each position (and head), one cell at a time, with the
    source's values, and return the metric of every cell as a ``PatchGrid`` (axes ``layer``,
    [``head``,] ``position``; ``to_pandas()``, ``recovered()``, ``heatmap_svg()``, ``to_html()``).

    Args:
        model, input_args: the model and the input of the run to patch (the "corrupted" run).
        source: ``log_forward_pass`` of the run the values come from (the "clean" run).
        metric: ``metric(output) -> number`` (see ``tl.patch``).
        over: ``'modules'``: the output of each block of the model's longest numbered stack
            (``transformer.h.0`` ... ``transformer.h.11``); ``'heads'``: each attention module's
            per-head tensor (the input of its output projection, e.g. ``transformer.h.0.attn.c_proj@input``),
            one row per head; or a list of keys as in ``tl.patch``.
        positions: ``'each'``: every position along ``position_dim``; a list of positions; or
            None: the whole tensor in one column.
        heads: None; ``'each'`` or a list of heads: one row per layer and head (the last
            dimension split into ``n_heads``, found on the module when not given).
        input_kwargs, random_seed: as for ``log_forward_pass``.
        replay: False to run the model once per cell instead (the reference the replay is
            tested against; much slower).
        verify: check one cell (the one the patch moved most) against a run of the model with
            that patch, so a dependency the trace did not see (a value that left torch and came
            back, e.g. through numpy) cannot go unnoticed: ``PatchError`` when they disagree.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> clean = tl.log_forward_pass(model, torch.ones(1, 3, 2))
        >>> grid = tl.patch_sweep(model, torch.zeros(1, 3, 2), source=clean, metric=lambda out: out.sum())
        >>> grid.dims, grid.shape
        (('layer', 'position'), (2, 3))
    """
    require_model(model, "patch_sweep")
    check_arguments("patch_sweep", locals())  # metric, flags, seed, position_dim, n_heads: torchlens/arguments.py
    if metric is None:
        raise PatchError("patch_sweep: give metric=, a function of the model's output returning one number.")
    if not isinstance(source, ModelHistory):
        raise PatchError(
            f"patch_sweep: source must be a ModelHistory (tl.log_forward_pass), not {type(source).__name__}."
        )
    session = PatchSession(model, as_args(input_args), as_kwargs(input_kwargs), metric=metric, seed=random_seed)
    if isinstance(over, str) and over == "heads":
        keys: List[Union[str, int]] = list(head_sites(session.history, model))
        heads = "each" if heads is None else heads
    else:
        keys = list(blocks(session.history)) if isinstance(over, str) and over == "modules" else _keys(over)
    targets = resolve(session.history, source, keys)
    position_list = _axis(
        targets, positions, "positions", lambda t: t.entry.activation.shape[position_dim % t.entry.activation.dim()]
    )
    head_list = (
        None if heads is None else _axis(targets, heads, "heads", lambda t: session.n_heads(t.entry, n_heads) or 0)
    )
    if head_list is not None and not head_list:
        raise PatchError("patch_sweep: heads= needs the number of heads; give n_heads=.")
    rows = [(t, h) for t in targets for h in (head_list if head_list is not None else [None])]
    values: Any = np.empty((len(rows), len(position_list) if position_list is not None else 1))
    start = perf_counter()
    for i, (target, head) in enumerate(rows):
        for j, position in enumerate(position_list if position_list is not None else [None]):
            selection = Selection(positions=position, position_dim=position_dim, heads=head)
            make = make_patches if j == 0 else _unchecked  # the first cell of a row checks the shapes
            patches = make(session, [target], selection, n_heads)
            outputs, _ = session.patched(patches, replay)
            values[i, j] = session.score(outputs)[1]
    seconds = perf_counter() - start
    if verify and replay and session.modes["replay"]:
        _verify(session, rows, values, positions=position_list, dims=(position_dim, n_heads))
    dims = ("layer", "head", "position") if head_list is not None else ("layer", "position")
    coords: Dict[str, List[Any]] = {"layer": [t.key if isinstance(t.key, str) else t.entry.label for t in targets]}
    if len(coords["layer"]) != len(set(coords["layer"])):  # a key naming several layers: their labels
        coords["layer"] = [t.entry.label for t in targets]
    if head_list is not None:
        coords["head"] = list(head_list)
        values = values.reshape(len(targets), len(head_list), -1)
    coords["position"] = list(position_list) if position_list is not None else ["all"]
    return PatchGrid(
        values=values,
        dims=dims,
        coords=coords,
        labels=[t.entry.label for t in targets],
        corrupt=float(session.corrupt_score()),
        clean=session.source_score(source),
        history=session.history,
        seconds=seconds,
        modes=dict(session.modes),
    )


def _unchecked(
    session: PatchSession, targets: List[Target], selection: Selection, n_heads: Optional[int]
) -> Dict[str, Patch]:
    """The patch of one cell, not tried first (the row's first cell was)."""
    (target,) = targets
    heads = session.n_heads(target.entry, n_heads) if selection.heads is not None else None
    source, label = target.source.activation, target.entry.label
    return {label: lambda value: selection.apply(value, source, heads, label)}


def _verify(session: PatchSession, rows: List[Any], values: np.ndarray, positions: Any, dims: Tuple[Any, Any]) -> None:
    """The cell whose patch moved the metric most, replayed and run through the model: the same output."""
    i, j = np.unravel_index(np.nanargmax(np.abs(values - session.corrupt_score())), values.shape)
    (target, head), (position_dim, n_heads) = rows[i], dims
    position = positions[j] if positions is not None else None
    selection = Selection(positions=position, position_dim=position_dim, heads=head)
    patches = make_patches(session, [target], selection, n_heads)
    replayed, _ = session.patched(patches)
    ran, _ = session.patched(patches, replay=False)
    session.modes["replay"] -= 1  # the check, not cells
    session.modes["model run"] -= 1
    for a, b in zip(replayed, ran):
        if a.shape != b.shape or not torch.allclose(a.detach(), b.detach(), rtol=1e-4, atol=1e-5, equal_nan=True):
            raise PatchError(
                f"patch_sweep: patching {target.entry.label} ({selection.describe()}) gives another output when the "
                "ops downstream are re-run from the saved graph than when the model runs with the patch: the model "
                "computes something torchlens did not see (e.g. a value that leaves torch and comes back). Use "
                "replay=False to run the model for each cell."
            )


def blocks(history: ModelHistory) -> List[str]:
    """The modules of the model's longest numbered stack (``h.0``, ``h.1``, ...), in order."""
    stacks: Dict[str, List[int]] = {}
    for address in history.modules.passes:
        found = re.fullmatch(r"(.*\.)?(\d+)", address)
        if found:
            stacks.setdefault(found.group(1) or "", []).append(int(found.group(2)))
    if not stacks:
        raise PatchError(
            "patch_sweep: over='modules' patches the blocks of a numbered stack of modules (a ModuleList or "
            "Sequential, e.g. transformer.h.0, transformer.h.1, ...), and this model has none that ran; give "
            "over= a list of layer labels or module addresses."
        )
    prefix = max(stacks, key=lambda p: (len(stacks[p]), -p.count(".")))
    return [f"{prefix}{n}" for n in sorted(stacks[prefix])]


def _keys(over: Over) -> List[Union[str, int]]:
    if isinstance(over, str) or isinstance(over, int):
        raise PatchError(f"patch_sweep: over= must be 'modules', 'heads' or a list of layer keys, not {over!r}.")
    if not isinstance(over, Sequence) or not over:
        raise PatchError(f"patch_sweep: over= must be 'modules' or a non-empty list of layer keys; got {over!r}.")
    return list(over)


def _axis(targets: List[Target], each: Each, name: str, size_of: Callable[[Target], int]) -> Optional[List[int]]:
    """The indices of an axis: every one (``'each'``, the same count for every layer), a list, or None."""
    if each is None:
        return None
    if isinstance(each, str):
        if each != "each":
            raise PatchError(f"patch_sweep: {name}= must be 'each', a list of indices or None, not {each!r}.")
        sizes = {size_of(t) for t in targets}
        if len(sizes) != 1:
            raise PatchError(
                f"patch_sweep: {name}='each' needs the same number of {name} in every layer swept, but they have "
                f"{sorted(sizes)}; sweep layers that agree, or give a list of {name}."
            )
        return list(range(sizes.pop()))
    return [int(i) for i in each]


__all__ = ["patch_sweep", "blocks"]
