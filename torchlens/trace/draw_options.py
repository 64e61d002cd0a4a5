"""How to draw a traced graph, as one value: ``DrawOptions`` (what the six ``vis_*`` keywords say).

``log_forward_pass(model, x, draw=DrawOptions(...))``, ``render_graph(history, draw=...)`` and
``build_dot(history, draw=...)`` take it; their ``vis_*`` keywords still work and build the same
value (``resolve_draw``). The value is checked once, when it is made. This module stands on the
argument checks alone (not on the drawing), so ``import torchlens`` stays light.

Example:
    >>> import os, tempfile, torch, torchlens as tl
    >>> out = os.path.join(tempfile.mkdtemp(), "mlp")
    >>> draw = tl.DrawOptions(mode="rolled", direction="leftright", outpath=out, fileformat="svg", save_only=True)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    >>> history = tl.log_forward_pass(model, torch.rand(2, 4), draw=draw)
    >>> os.path.exists(out + ".svg")
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional

from ..arguments import (
    RULES,
    ArgumentValueError,
    refuse_type,
    require_bool,
    require_choice,
    require_instance,
    require_int,
    require_path,
)

MODES = ("unrolled", "rolled")
DIRECTIONS = ("bottomup", "topdown", "leftright")
# each field under the keyword name log_forward_pass, render_graph and build_dot know it by
VIS_NAMES = {
    "mode": "vis_mode",
    "nesting_depth": "vis_nesting_depth",
    "direction": "vis_direction",
    "outpath": "vis_outpath",
    "fileformat": "vis_fileformat",
    "save_only": "vis_save_only",
}
# the older short names render_graph and build_dot accept too (not both spellings)
OLD_NAMES = {
    "direction": "vis_direction",
    "outpath": "vis_outpath",
    "fileformat": "vis_fileformat",
    "save_only": "vis_save_only",
}


@dataclass(frozen=True)
class DrawOptions:
    """How to draw a traced graph with graphviz (checked when made: a bad value raises at once).

    Attributes:
        mode: ``'unrolled'`` (one node per pass of each layer) or ``'rolled'`` (one node per
            layer, edges labelled with the passes they belong to).
        nesting_depth: ``None`` draws every module box; ``N`` keeps the boxes of modules at most
            ``N`` levels deep and draws each module one level deeper as one node.
        direction: ``'bottomup'``, ``'topdown'`` or ``'leftright'``.
        outpath: the file to write, without its extension.
        fileformat: ``'pdf'``, ``'png'``, ``'svg'`` or another format graphviz's ``dot`` knows.
        save_only: only write the file; False also shows it (inline in a notebook, otherwise in
            the system viewer when there is one).

    Example:
        >>> import torchlens as tl
        >>> draw = tl.DrawOptions(mode="rolled", nesting_depth=1)
        >>> draw.outpath + "." + draw.fileformat
        'graph.pdf'
        >>> tl.DrawOptions(mode="sideways")
        Traceback (most recent call last):
        ...
        torchlens.arguments.ArgumentValueError: DrawOptions: mode takes one of 'unrolled', 'rolled', not 'sideways' (str).
    """

    mode: str = "unrolled"
    nesting_depth: Optional[int] = None
    direction: str = "bottomup"
    outpath: str = "graph"
    fileformat: str = "pdf"
    save_only: bool = False

    def __post_init__(self) -> None:
        check_fields("DrawOptions", asdict(self), {name: name for name in VIS_NAMES})

    def keywords(self) -> Dict[str, Any]:
        """The same options as ``vis_*`` keywords (``{'vis_mode': 'rolled', ...}``)."""
        return {VIS_NAMES[name]: value for name, value in asdict(self).items()}


def check_fields(caller: str, values: Mapping[str, Any], shown: Mapping[str, str]) -> None:
    """Each field of ``values`` by its rule; ``shown`` names each field as the caller knows it."""
    require_choice(shown["mode"], values["mode"], caller, MODES)
    require_int(shown["nesting_depth"], values["nesting_depth"], caller, minimum=0, optional=True)
    require_choice(shown["direction"], values["direction"], caller, DIRECTIONS)
    require_path(shown["outpath"], values["outpath"], caller, new=True)
    if values["fileformat"] is None:
        raise refuse_type(caller, shown["fileformat"], None, "a graphviz output format such as 'pdf', 'png' or 'svg'")
    RULES["vis_fileformat"](shown["fileformat"], values["fileformat"], caller)
    require_bool(shown["save_only"], values["save_only"], caller)


def move_old_names(caller: str, old_names: Mapping[str, Any], given: Dict[str, Any]) -> Dict[str, Any]:
    """``given`` (``vis_*`` name -> value, None: not given) with values passed under their older
    names (``outpath=``) moved over; unknown names and both spellings of one option raise
    ``TypeError``, as Python does for a keyword a function lacks."""
    values = dict(given)
    for old, value in old_names.items():
        new = OLD_NAMES.get(old)
        if new is None or new not in values:
            raise TypeError(f"{caller}() got an unexpected keyword argument {old!r}")
        if values[new] is not None:
            raise TypeError(f"{caller}() got both {new}= and {old}= (its older name); pass only {new}=.")
        values[new] = value
    return values


def resolve_draw(caller: str, draw: Optional[DrawOptions], given: Mapping[str, Any]) -> DrawOptions:
    """``draw``, or the ``DrawOptions`` the ``vis_*`` keywords of ``given`` make (None: not
    given, the default), checked under the names the caller was given them by.

    Example:
        >>> resolve_draw("render_graph", None, {"vis_mode": "rolled"}).mode
        'rolled'
    """
    named = [name for name, value in given.items() if value is not None]
    if draw is not None:
        require_instance("draw", draw, caller, DrawOptions, takes="a torchlens.DrawOptions")
        if named:
            raise ArgumentValueError(
                f"{caller}: draw= and {', '.join(n + '=' for n in named)} both give drawing options. Put them "
                f"all in draw (dataclasses.replace(draw, ...) changes some), or pass the vis_* keywords alone."
            )
        return draw
    defaults = DrawOptions.__dataclass_fields__
    values = {f.name: given.get(VIS_NAMES[f.name]) for f in fields(DrawOptions)}
    values = {name: defaults[name].default if value is None else value for name, value in values.items()}
    check_fields(caller, values, VIS_NAMES)  # the messages name the caller's keywords
    return DrawOptions(**values)


def log_draw(draw: Optional[DrawOptions], given: Mapping[str, Any]) -> Optional[DrawOptions]:
    """``log_forward_pass``'s drawing: ``draw``, or what its ``vis_*`` keywords say, or None (no
    drawing: ``vis_mode`` ``'none'`` or not given; the other ``vis_*`` are still checked)."""
    mode = given.get("vis_mode")
    if draw is None and mode is None and all(value is None for value in given.values()):
        return None  # nothing asked: the common call, spared resolving the options
    require_choice("vis_mode", mode, "log_forward_pass", ("none", None) + MODES)
    if draw is not None:
        return resolve_draw("log_forward_pass", draw, given)
    options = resolve_draw("log_forward_pass", None, {**given, "vis_mode": None if mode == "none" else mode})
    return None if mode in ("none", None) else options


__all__ = ["DrawOptions", "resolve_draw", "log_draw", "move_old_names", "MODES", "DIRECTIONS", "VIS_NAMES", "OLD_NAMES"]
