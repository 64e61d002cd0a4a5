"""The options of ``build_dot`` and ``render_graph``: ``DrawOptions`` (what to draw, where) and
``GraphStyle`` (how it looks: graphviz attribute overrides, extra edges, module boxes, gradients,
progress), each given as one value or by its keywords (``read_options``), checked once.

Example:
    >>> from torchlens.trace.render.options import GraphStyle, read_options
    >>> draw, style = read_options("build_dot", None, None, {"vis_mode": "rolled", "progress": False})
    >>> draw.mode, style.progress, style.inline_single_op_modules
    ('rolled', False, True)
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Collection, Dict, Iterable, Mapping, Optional, Tuple, Union

from ...arguments import ArgumentValueError, check_arguments, refuse_type, require_bool, require_instance
from ..draw_options import OLD_NAMES, VIS_NAMES, DrawOptions, move_old_names, resolve_draw
from .structure import ExtraEdge

AttrValue = Union[str, int, float, Callable[..., Any]]
AttrOverrides = Optional[Mapping[str, AttrValue]]
ATTR_NAMES = ("graph_attrs", "node_attrs", "edge_attrs", "module_attrs")
# build_dot draws; it writes no file, so it takes only these of DrawOptions' keywords
DOT_VIS_NAMES = ("vis_mode", "vis_nesting_depth", "vis_direction")


@dataclass(frozen=True)
class GraphStyle:
    """How the drawn graph looks (``build_dot``'s and ``render_graph``'s keywords of the same names).

    Attributes:
        graph_attrs, node_attrs, edge_attrs, module_attrs: graphviz attributes that override the
            defaults. Values are strings or callables: ``node_attrs`` callables receive the
            node's ``TensorLogEntry`` / ``RolledLayer`` / ``CollapsedModule`` / ``TensorGroup``;
            ``edge_attrs`` callables receive ``(parent, child)`` (the same kinds);
            ``module_attrs`` callables receive the module address; ``graph_attrs`` callables
            receive the history. A callable returning None keeps the default.
        extra_edges: ``(tail label, head label, attributes)`` drawn in addition to the data edges.
        progress: show a progress bar while building, and the time ``dot`` takes; default: when
            there are more than 500 nodes.
        inline_single_op_modules: draw no box for a module that holds a single operation (the
            node names the module in italics instead). False: a box for every module.
        show_gradients: draw the backward path as separate blue edges; default: when gradients
            were saved.

    Example:
        >>> GraphStyle(node_attrs={"fillcolor": "pink"}).inline_single_op_modules
        True
    """

    graph_attrs: AttrOverrides = None
    node_attrs: AttrOverrides = None
    edge_attrs: AttrOverrides = None
    module_attrs: AttrOverrides = None
    extra_edges: Optional[Iterable[ExtraEdge]] = None
    progress: Optional[bool] = None
    inline_single_op_modules: bool = True
    show_gradients: Optional[bool] = None

    def __post_init__(self) -> None:
        check_style("GraphStyle", asdict(self))


STYLE_NAMES = tuple(f.name for f in fields(GraphStyle))


def check_style(caller: str, options: Mapping[str, Any]) -> None:
    """The style options of ``options`` by their rules (those not given are not checked)."""
    check_arguments(caller, dict(options))  # progress, show_gradients: the shared rules
    require_bool("inline_single_op_modules", options.get("inline_single_op_modules", True), caller)
    for name in ATTR_NAMES:
        attrs = options.get(name)
        if attrs is not None and not (
            isinstance(attrs, Mapping)
            and all(
                isinstance(k, str) and (v is None or callable(v) or isinstance(v, (str, int, float)))
                for k, v in attrs.items()
            )
        ):
            raise refuse_type(
                caller, name, attrs, "a dict of graphviz attribute name -> str (or a function giving one)"
            )
    edges = options.get("extra_edges")
    if edges is not None and not (
        isinstance(edges, (list, tuple)) and all(isinstance(e, (list, tuple)) and len(e) == 3 for e in edges)
    ):
        raise refuse_type(caller, "extra_edges", edges, "a list of (tail label, head label, attributes dict)")


def _resolve_style(caller: str, style: Optional[GraphStyle], given: Dict[str, Any]) -> GraphStyle:
    if style is not None:
        require_instance("style", style, caller, GraphStyle, takes="a torchlens.trace.render.GraphStyle")
        named = [name for name, value in given.items() if value is not None]
        if named:
            raise ArgumentValueError(
                f"{caller}: style= and {', '.join(n + '=' for n in named)} both give the graph's style. Put them "
                "all in style (dataclasses.replace(style, ...) changes some), or pass the keywords alone."
            )
        return style
    check_style(caller, given)  # the messages name the caller
    return GraphStyle(**given)


def read_options(
    caller: str,
    draw: Optional[DrawOptions],
    style: Optional[GraphStyle],
    options: Dict[str, Any],
    *,
    vis_names: Collection[str] = tuple(VIS_NAMES.values()),
) -> Tuple[DrawOptions, GraphStyle]:
    """``draw`` and ``style``, or the values the keywords in ``options`` make: ``vis_names``
    (and their older names), ``GraphStyle``'s fields; another keyword is a ``TypeError``."""
    old = {name: options[name] for name in options if name in OLD_NAMES}
    given_vis = move_old_names(caller, old, {name: options.get(name) for name in vis_names})
    refuse_unknown_keywords(caller, options, (*vis_names, *OLD_NAMES, *STYLE_NAMES))
    given_style = {name: options[name] for name in STYLE_NAMES if name in options}
    return resolve_draw(caller, draw, given_vis), _resolve_style(caller, style, given_style)


# a name the option is known by in other tools, where the closest spelling would mislead
_ELSEWHERE = {"vis_opt": "vis_mode"}


def refuse_unknown_keywords(caller: str, given: Iterable[str], known: Collection[str]) -> None:
    """A ``TypeError`` naming ``caller`` for the first of ``given`` not in ``known``, with the
    closest known name when one is close (``vis_opt``: did you mean ``vis_mode``?).

    Example:
        >>> refuse_unknown_keywords("show_model_graph", ["vis_opt"], ["vis_mode", "node_attrs"])
        Traceback (most recent call last):
        TypeError: show_model_graph() got an unexpected keyword argument 'vis_opt'; did you mean 'vis_mode'?
    """
    for name in given:
        if name not in known:
            close = (
                [_ELSEWHERE[name]]
                if _ELSEWHERE.get(name) in known
                else difflib.get_close_matches(name, list(known), n=1)
            )
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")


__all__ = [
    "GraphStyle",
    "read_options",
    "refuse_unknown_keywords",
    "check_style",
    "AttrOverrides",
    "DOT_VIS_NAMES",
    "STYLE_NAMES",
]
