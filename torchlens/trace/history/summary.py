"""What ``print(history)`` shows. A small pass (at most ``SMALL_LAYERS`` layers) prints as the
seed did: a header, the module hierarchy and the numbered list of layers (``0: input_1_0`` ...),
the names to index the history with. A larger one prints the header and one row per module
(address indented by depth, class, calls, output shape of the first call, parameters, bytes of
saved activations), with runs of identical numbered blocks folded into one row (``h.0-5
GPT2Block x6``). ``history.summary()`` gives every module's row, ``history.print_layers()``
every layer.

Everything here is linear in the entries times their module depth, so printing stays fast for
models with tens of thousands of operations; the default print shows at most ``MAX_ROWS``
modules (the deepest levels that fit) and says how to see the rest.

Example:
    >>> import torch, torchlens as tl
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    >>> h = tl.log_forward_pass(model, torch.ones(2, 3), random_seed=0)
    >>> print(str(h)[str(h).index("Module Hierarchy"):])  # doctest: +NORMALIZE_WHITESPACE
    Module Hierarchy:
        0
        1
    Layers:
        0: input_1_0
        1: linear_1_1
        2: relu_1_2
        3: output_1_3
    >>> text = h.summary()
    >>> print(text[text.index("Module  "):])
    Module  Class   Calls  Output shape  Params  Saved
    0       Linear      1  (2, 4)            16   32 B
    1       ReLU        1  (2, 4)             0   32 B
    <BLANKLINE>
    4 layers: history.print_layers() lists every one.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from ..records.format import human_bytes
from ..records.meta import is_meta_history
from .view import HistoryView

MAX_ROWS = 250  # modules shown by the default print; deeper levels are left out beyond it
SMALL_LAYERS = 60  # a pass of at most this many layers prints every layer (the seed's printout)


# An output's shape (torch.Size; a nested tensor's has None for its ragged dimensions).
_Shape = Optional[Tuple[Optional[int], ...]]
# What must agree for two modules to fold: class, calls, shapes, params, saved bytes, submodules'.
_Signature = Tuple[object, ...]
# Per module: its first call's output shapes, its parameter count, its saved bytes.
_Facts = Tuple[Dict[str, List[_Shape]], Dict[str, int], Dict[str, int]]


class SummaryText(str):
    """Text that shows as itself in a notebook or the REPL (``history.summary()``), not as a
    quoted string with ``\\n`` in it."""

    def __repr__(self) -> str:
        return str(self)


class Row(NamedTuple):
    """One row of the module table: ``shown`` is the address as printed (``h.0-5`` for a folded
    run), ``address`` a module it stands for, ``run`` the run's length and ``copies`` how many
    modules the row stands for (runs folded around it included)."""

    shown: str
    depth: int
    address: str
    run: int
    copies: int


def _tree(history: HistoryView, signatures: Optional[Dict[str, _Signature]] = None) -> List[Row]:
    """Every module, parents before children, depth 1 for top level; with ``signatures``, a run
    of numbered siblings with equal signatures (``h.0`` ... ``h.5``) is one row, its submodules
    shown once under it (``h.0-5.attn``)."""
    children = history.modules.children
    out: List[Row] = []

    def walk(address: str, shown: str, depth: int, copies: int) -> None:  # recursion: module depth
        kids = children.get(address, [])
        i = 0
        while i < len(kids):
            child = kids[i]
            run = _run_length(kids, i, address, signatures) if signatures is not None else 1
            label = shown + child[len(address) :]
            if run > 1:
                label += "-" + _index(kids[i + run - 1], address)
            out.append(Row(label, depth, address=child, run=run, copies=copies * run))
            folded.extend(kids[i + 1 : i + run])
            walk(child, label, depth + 1, copies * run)
            i += run

    folded: List[str] = []  # the blocks a run's first one stands for
    walk("", "", 1, 1)
    listed = {r.address for r in out}
    while folded:  # they and their submodules are not left over
        address = folded.pop()
        listed.add(address)
        folded.extend(children.get(address, []))
    out.extend(
        Row(a, a.count(".") + 1, address=a, run=1, copies=1) for a in history.modules.addresses if a not in listed
    )
    return out


def _index(child: str, parent: str) -> str:
    """``5`` for ``h.5`` under ``h`` (the child's own name)."""
    return child[len(parent) + 1 :] if parent else child


def _run_length(kids: List[str], i: int, parent: str, signatures: Dict[str, _Signature]) -> int:
    """How many siblings from ``kids[i]`` on are numbered consecutively and alike."""
    first = _index(kids[i], parent)
    if not first.isdigit():
        return 1
    run = 1
    while i + run < len(kids):
        name = _index(kids[i + run], parent)
        if not name.isdigit() or int(name) != int(first) + run:
            break
        if signatures.get(kids[i + run]) != signatures.get(kids[i]):
            break
        run += 1
    return run


def _signatures(history: HistoryView, facts: _Facts) -> Dict[str, _Signature]:
    """What must agree for two modules to fold into one row: class, calls, output shapes,
    parameters, saved bytes, and the same of every submodule under the same relative name."""
    shapes, params, saved = facts
    children = history.modules.children
    types, passes = history.modules.types, history.modules.passes
    found: Dict[str, _Signature] = {}

    def signature(address: str) -> _Signature:
        if address not in found:
            found[address] = (
                types.get(address),
                passes.get(address, 0),
                tuple(None if shape is None else tuple(shape) for shape in shapes.get(address, ())),
                params.get(address, 0),
                saved.get(address, 0),
                tuple((c[len(address) :], signature(c)) for c in children.get(address, [])),
            )
        return found[address]

    for address in history.modules.addresses:
        signature(address)
    return found


def _module_facts(history: HistoryView) -> _Facts:
    """Output shapes of each module's first call, its parameter count, its saved bytes."""
    outputs: Dict[str, List[Tuple[int, int, _Shape]]] = {}
    saved: Dict[str, int] = {}
    for i, e in enumerate(history.layer_list):
        for address, pass_num in e.output_of_modules or ():
            if int(pass_num) == 1:
                position = (e.module_output_positions or {}).get((address, pass_num), ())
                depth = len(position) if isinstance(position, tuple) else 1
                outputs.setdefault(address, []).append((depth, i, e.shape))
        nbytes = e.saved_nbytes
        if nbytes:
            for address in {a for a, _ in e.module_stack or ()}:
                saved[address] = saved.get(address, 0) + nbytes
    params: Dict[str, int] = {}
    for name, (_, numel, _) in history.param_info.items():
        address = name.rpartition(".")[0]
        while address:  # a parameter counts for its module and every module around it
            params[address] = params.get(address, 0) + numel
            address = address.rpartition(".")[0]
    # the main output first: the least nested one (a model's hidden state, not its cache)
    shapes = {a: [shape for _, _, shape in sorted(found, key=lambda t: t[:2])] for a, found in outputs.items()}
    return shapes, params, saved


def _shape_text(shapes: Optional[List[_Shape]]) -> str:
    if not shapes:
        return "-"
    first = shapes[0]
    text = str(tuple(first)) if first is not None else "?"
    return text + (f" +{len(shapes) - 1} more" if len(shapes) > 1 else "")


def _header(history: HistoryView) -> List[str]:
    structure = f"recurrent (at most {history.max_passes} loops)" if history.is_recurrent else "purely feedforward"
    structure += ", with branching" if history.is_branching else ", without branching"
    if history.has_conditional_branching:
        structure += ", with conditional branching"
    lines = [
        f"Log of {history.model_name} forward pass:",
        f"\tModel structure: {structure}; {len(history.modules.addresses)} total modules.",
        f"\t{history.num_tensors} tensors ({human_bytes(history.tensor_bytes)}) computed in forward pass; "
        + (
            "no values saved (meta tensors: shapes and dtypes only)."
            if is_meta_history(history)
            else f"{history.num_tensors_saved} tensors ({human_bytes(history.saved_tensor_bytes)}) saved."
        ),
        f"\t{history.num_param_tensors} parameter tensors, used by {history.num_param_operations} operations "
        f"({history.num_params} params total; {human_bytes(history.param_bytes)}).",
    ]
    untraced = history.untraced_layers
    if untraced:
        count = "1 tensor comes" if len(untraced) == 1 else f"{len(untraced)} tensors come"
        lines.append(
            f"\tWARNING: {count} from untraced producers (calls torchlens does not trace; "
            f"what they were computed from is unknown): {', '.join(untraced)}"
        )
    lines.extend(f"\tNote: {note}" for note in history.notes)
    lines.append(f"\tRandom seed: {history.random_seed}")
    lines.append(
        f"\tTime elapsed: {history.elapsed_time:.3f}s (forward pass {history.pass_time:.3f}s, "
        f"postprocessing {history.postprocess_time:.3f}s)"
    )
    return lines


def _auto_depth(tree: List[Row]) -> Optional[int]:
    """The deepest level whose modules fit in ``MAX_ROWS`` rows (None: all of them fit)."""
    if len(tree) <= MAX_ROWS:
        return None
    per_depth: Dict[int, int] = {}
    for row in tree:
        per_depth[row.depth] = per_depth.get(row.depth, 0) + 1
    total, chosen = 0, 1
    for d in sorted(per_depth):
        total += per_depth[d]
        if total > MAX_ROWS:
            break
        chosen = d
    return chosen


def _table(rows: List[List[str]]) -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {2, 4, 5}  # numbers line up on the right
    return [
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def summary_text(history: HistoryView, depth: Optional[int] = None, auto: bool = False) -> SummaryText:
    """The header and the module table of ``history``, modules at most ``depth`` levels deep
    (``None``: all). ``auto`` (``print(history)``): a pass of at most ``SMALL_LAYERS`` layers
    gives ``layers_text`` instead; a larger one folds runs of identical blocks and keeps the
    deepest levels that fit in ``MAX_ROWS`` rows.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(3, 2)), torch.ones(1, 3))
        >>> summary_text(h, depth=0).splitlines()[-1]  # no module rows
        '3 layers: history.print_layers() lists every one; 1 deeper module not shown: history.summary() shows all.'
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise ValueError(f"depth must be None or an int >= 0 (0: no module rows), not {depth!r}")
    if auto and depth is None and len(history) <= SMALL_LAYERS:
        return SummaryText(layers_text(history))
    facts = _module_facts(history)
    tree = _tree(history, _signatures(history, facts) if auto else None)
    if auto and depth is None:
        depth = _auto_depth(tree)
    shown = [r for r in tree if depth is None or r.depth <= depth][: MAX_ROWS if auto else None]
    shapes, params, saved = facts
    meta = is_meta_history(history)  # meta tensors hold no values: nothing saved to count
    lines = _header(history)
    if shown:
        rows = [["Module", "Class", "Calls", "Output shape", "Params", "Saved"]]
        for r in shown:
            kind = history.modules.types.get(r.address, "?")
            rows.append(
                [
                    "  " * (r.depth - 1) + r.shown,
                    kind if r.run == 1 else f"{kind} x{r.run}",
                    str(history.modules.passes.get(r.address, 0)),
                    _shape_text(shapes.get(r.address)),
                    f"{params.get(r.address, 0):,}",
                    "-" if meta else human_bytes(saved.get(r.address, 0)),
                ]
            )
        lines.append("")
        lines.extend(_table(rows))
    lines.append("")
    hidden = sum(r.copies for r in tree) - sum(r.copies for r in shown)
    folded = next((r for r in shown if r.run > 1), None)
    lines.append(_footer(history, hidden, folded, nested=any(r.depth > 1 for r in shown)))
    return SummaryText("\n".join(lines))


def _footer(history: HistoryView, hidden: int, folded: Optional[Row], nested: bool) -> str:
    kept = (
        f"{len(history)} layers"
        if len(history) == history.num_tensors
        else f"{len(history)} of {history.num_tensors} layers kept (the saved ones; keep_unsaved_layers=True keeps all)"
    )
    text = f"{kept}: history.print_layers() lists every one"
    if hidden:
        text += f"; {hidden} deeper module{'s' if hidden > 1 else ''} not shown"
    if folded is not None:
        kind = history.modules.types.get(folded.address, "?")
        text += (
            f"{',' if hidden else ';'} identical blocks folded ({folded.shown} stands for {folded.run} {kind}; "
            "the numbers are each one's)"
        )
    if hidden or folded is not None:
        text += ": history.summary() shows all"
    elif nested:
        text += "; history.summary(depth=1) shows the top-level modules only"
    return text + "."


def layers_text(history: HistoryView) -> str:
    """The header, the module hierarchy and one line per layer (``history.print_layers()``).

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
        >>> [line.strip() for line in layers_text(h).splitlines()[-3:]]
        ['0: input_1_0', '1: linear_1_1', '2: output_1_2']
    """
    lines = _header(history)
    lines.append("\tModule Hierarchy:")
    lines.extend(_hierarchy_lines(history, "", 2))
    lines.append(
        "\tLayers:"
        if len(history) == history.num_tensors
        else f"\tLayers ({len(history)} of {history.num_tensors} kept: the saved ones; keep_unsaved_layers=True keeps all):"
    )
    lines.extend(f"\t\t{i}: {e.label}{e.call_note()}" for i, e in enumerate(history.layer_list))
    return "\n".join(lines)


def _hierarchy_lines(history: HistoryView, address: str, depth: int) -> List[str]:
    children = history.modules.children
    lines = []
    for child in children.get(address, []):
        grandchildren = children.get(child, [])
        if not grandchildren:
            lines.append("\t" * depth + child)
            continue
        lines.append("\t" * depth + child + ":")
        if all(not children.get(g) for g in grandchildren):
            lines.extend(_wrap(grandchildren, "\t" * depth + "    "))
        else:
            lines.extend(_hierarchy_lines(history, child, depth + 1))
    return lines


def _wrap(items: List[str], indent: str, width: int = 100) -> List[str]:
    lines, current = [], ""
    for item in items:
        piece = item if not current else ", " + item
        if current and len(indent) + len(current) + len(piece) > width:
            lines.append(indent + current + ",")
            current = item
        else:
            current += piece
    if current:
        lines.append(indent + current)
    return lines
