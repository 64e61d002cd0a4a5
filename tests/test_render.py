"""The graphviz renderer (torchlens.trace.render): DOT source, clusters, rolled passes, collapsed modules,
styles, overrides, real files in three formats, and a missing ``dot``.

Golden DOT files live in tests/golden/; regenerate them with ``pytest tests/test_render.py
--regen-golden`` (or TORCHLENS_REGEN_GOLDEN=1) and review the diff.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Dict, List, Tuple

import graphviz
import pytest
import torch
from torch import nn

import torchlens as tl
from examples.models import SimpleRecurrent
from torchlens import show_model_graph
from torchlens.trace.history.model_history import ModelHistory, ModuleInfo
from torchlens.trace.records.tensor_log import TensorLogEntry
from torchlens.trace.render import GraphvizNotFoundError, build_dot, render_graph, style, svg_of
from torchlens.trace.render import graphviz as tl_graphviz

GOLDEN = Path(__file__).parent / "golden"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot program is not installed")


# ----- small models ---------------------------------------------------------------------------------


class SkipSub(nn.Module):
    """A skip connection (``b + x``) and a ``sub`` whose argument order matters."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.fc2 = nn.Linear(3, 3)

    def forward(self, x):
        a = torch.relu(self.fc1(x))
        b = self.fc2(a)
        return (b + x) - a


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))

    def forward(self, x):
        return x + self.mlp(x)


class NestedModel(nn.Module):
    """blocks (Sequential) > blocks.0 / blocks.1 (Block) > mlp (Sequential) > Linear, ReLU, Linear."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.blocks(x))


class SharedBlock(nn.Module):
    """One two-operation block called twice: one box per pass (unrolled), one box (rolled)."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())

    def forward(self, x):
        return self.block(self.block(x))


class Conditional(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def _history(model_cls, *shape, mode_seed=0):
    torch.manual_seed(0)
    model = model_cls()
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(1))
    return tl.log_forward_pass(model, x, random_seed=mode_seed)


@pytest.fixture(scope="module")
def recurrent():
    return _history(SimpleRecurrent, 6, 5)


@pytest.fixture(scope="module")
def skip_sub():
    return _history(SkipSub, 2, 3)


@pytest.fixture(scope="module")
def nested():
    return _history(NestedModel, 2, 3)


# ----- a tiny reader of the DOT source --------------------------------------------------------------
def parse_dot(source: str) -> Tuple[Dict[str, List[str]], List[Tuple[str, str, List[str], str]]]:
    """node id -> enclosing clusters (outermost first); edges as (tail, head, clusters, attributes)."""
    stack: List[str] = []
    nodes: Dict[str, List[str]] = {}
    edges = []
    for line in source.splitlines():
        text = line.strip()
        sub = re.match(r'^subgraph ("?)(\S+?)\1 \{$', text)
        if sub:
            stack.append(sub.group(2))
            continue
        if text == "}":
            if stack:
                stack.pop()
            continue
        edge = re.match(r'^("[^"]+"|\S+) -> ("[^"]+"|\S+)(?: \[(.*)\])?$', text)
        if edge:
            edges.append((edge.group(1).strip('"'), edge.group(2).strip('"'), list(stack), edge.group(3) or ""))
            continue
        node = re.match(r'^("[^"]+"|\S+) \[(.*)\]$', text)
        if node and node.group(1) not in ("graph", "node", "edge"):
            nodes[node.group(1).strip('"')] = list(stack)
    return nodes, edges


def _edge(edges, tail, head):
    found = [e for e in edges if e[0] == tail and e[1] == head]
    assert len(found) == 1, (tail, head, found)
    return found[0]


# ----- golden DOT files -----------------------------------------------------------------------------
def _regen(request) -> bool:
    return (
        bool(request.config.getoption("--regen-golden", default=False))
        or os.environ.get("TORCHLENS_REGEN_GOLDEN") == "1"
    )


@pytest.mark.parametrize(
    "name, options",
    [
        ("recurrent_unrolled", {"vis_mode": "unrolled"}),
        ("recurrent_rolled", {"vis_mode": "rolled"}),
        ("skip_sub", {"direction": "topdown"}),
        ("nested_depth1", {"vis_nesting_depth": 1}),
    ],
)
def test_golden_dot(request, name, options):
    history = {
        "recurrent": lambda: request.getfixturevalue("recurrent"),
        "skip": lambda: request.getfixturevalue("skip_sub"),
        "nested": lambda: request.getfixturevalue("nested"),
    }[name.split("_")[0]]()
    source = build_dot(history, **options).source
    path = GOLDEN / f"{name}.dot"
    if _regen(request):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"{path} is missing: run pytest with --regen-golden"
    assert source == path.read_text(), f"DOT source of {name} changed; rerun with --regen-golden and review"


def test_dot_source_is_deterministic():
    first = build_dot(_history(NestedModel, 2, 3), vis_nesting_depth=2).source
    second = build_dot(_history(NestedModel, 2, 3), vis_nesting_depth=2).source
    assert first == second
    assert not re.search(r"0x[0-9a-f]{6,}", first)  # no memory addresses


# ----- structure --------------------------------------------------------------------------------------
def test_argument_positions_only_where_order_matters(skip_sub):
    _, edges = parse_dot(build_dot(skip_sub).source)
    assert 'label="arg 0"' in _edge(edges, "add_1_4", "sub_1_5")[3]
    assert 'label="arg 1"' in _edge(edges, "relu_1_2", "sub_1_5")[3]
    assert "label" not in _edge(edges, "linear_2_3", "add_1_4")[3]  # add is commutative
    assert "label" not in _edge(edges, "input_1_0", "linear_1_1")[3]  # a single parent


def test_nodes_sit_in_their_innermost_module_and_edges_in_the_deepest_common_one(nested):
    nodes, edges = parse_dot(build_dot(nested, inline_single_op_modules=False).source)
    assert nodes["linear_1_1"] == [
        "cluster_blocks",
        "cluster_blocks.0",
        "cluster_blocks.0.mlp",
        "cluster_blocks.0.mlp.0",
    ]
    assert nodes["add_1_4"] == ["cluster_blocks", "cluster_blocks.0"]
    assert nodes["input_1_0"] == [] and nodes["output_1_10"] == []
    # linear -> relu: in mlp (not in mlp.0 or mlp.1); mlp output -> add: in blocks.0;
    # blocks.0's add -> blocks.1's first linear: in blocks; input -> first linear: top level.
    assert _edge(edges, "linear_1_1", "relu_1_2")[2] == ["cluster_blocks", "cluster_blocks.0", "cluster_blocks.0.mlp"]
    assert _edge(edges, "linear_2_3", "add_1_4")[2] == ["cluster_blocks", "cluster_blocks.0"]
    assert _edge(edges, "add_1_4", "linear_3_5")[2] == ["cluster_blocks"]
    assert _edge(edges, "input_1_0", "linear_1_1")[2] == []


def test_single_op_modules_are_named_inside_the_node(nested):
    source = build_dot(nested).source
    nodes, _ = parse_dot(source)
    assert nodes["linear_1_1"] == ["cluster_blocks", "cluster_blocks.0", "cluster_blocks.0.mlp"]
    assert "cluster_blocks.0.mlp.0" not in source and "<I>blocks.0.mlp.0 (Linear)</I>" in source


def test_module_passes_unrolled_and_rolled():
    history = _history(SharedBlock, 2, 3)
    unrolled = build_dot(history).source
    assert "subgraph cluster_block_pass1 {" in unrolled and "subgraph cluster_block_pass2 {" in unrolled
    assert "<B>block:2</B>" in unrolled
    rolled = build_dot(history, vis_mode="rolled").source
    nodes, edges = parse_dot(rolled)
    assert nodes["linear_1_1"] == ["cluster_block"] and "(x2)" in rolled
    # the block's weighted linear and its parameter-free tanh both fold into two passes
    assert "<B>tanh_1_2 (x2)</B>" in rolled
    assert "label=" not in _edge(edges, "linear_1_1", "tanh_1_2")[3]  # in every pass
    assert 'label="pass 1"' in _edge(edges, "input_1_0", "linear_1_1")[3]
    assert 'label="pass 2"' in _edge(edges, "tanh_1_2", "linear_1_1")[3]


def test_rolled_edges_carry_the_passes_they_belong_to(recurrent):
    source = build_dot(recurrent, vis_mode="rolled").source
    nodes, edges = parse_dot(source)
    assert set(nodes) == {"input_1_0", "linear_1_1", "add_1_2", "mul_1_3", "output_1_4"}
    assert "<B>linear_1_1 (x4)</B>" in source
    assert 'label="pass 1"' in _edge(edges, "input_1_0", "linear_1_1")[3]
    assert 'label="passes 2-4"' in _edge(edges, "mul_1_3", "linear_1_1")[3]
    assert 'label="pass 4"' in _edge(edges, "mul_1_3", "output_1_4")[3]  # the parent's pass
    assert "label" not in _edge(edges, "linear_1_1", "add_1_2")[3]
    assert "label" not in _edge(edges, "add_1_2", "mul_1_3")[3]


def test_passes_text():
    assert style.passes_text({1}) == "pass 1"
    assert style.passes_text({4, 2, 3}) == "passes 2-4"
    assert style.passes_text({1, 3, 4, 6}) == "passes 1, 3-4, 6"


def test_collapsed_modules(nested):
    source = build_dot(nested, vis_nesting_depth=1).source
    nodes, edges = parse_dot(source)
    assert nodes["module.blocks.0.pass1"] == ["cluster_blocks"]
    assert nodes["module.blocks.1.pass1"] == ["cluster_blocks"]
    assert not any(n.startswith(("linear_1", "linear_2", "relu", "add")) for n in nodes)
    # blocks.0 -> blocks.1 carried two logged edges (into the first linear and the skip add): one drawn
    assert sorted(e[:2] for e in edges) == sorted(
        [
            ("input_1_0", "module.blocks.0.pass1"),
            ("module.blocks.0.pass1", "module.blocks.1.pass1"),
            ("module.blocks.1.pass1", "linear_5_9"),
            ("linear_5_9", "output_1_10"),
        ]
    )
    assert all(tail != head for tail, head, _, _ in edges)
    assert "4 ops, 24 params" in source and "out: 2x3 (24 B)" in source and "shape=box3d" in source
    top = parse_dot(build_dot(nested, vis_nesting_depth=0).source)[0]
    assert set(top) == {"input_1_0", "module.blocks.pass1", "linear_5_9", "output_1_10"}  # head: one op
    plain = parse_dot(build_dot(nested, vis_nesting_depth=0, inline_single_op_modules=False).source)[0]
    assert set(plain) == {"input_1_0", "module.blocks.pass1", "module.head.pass1", "output_1_10"}


def test_collapsed_module_in_rolled_mode(recurrent):
    source = build_dot(recurrent, vis_mode="rolled", vis_nesting_depth=0, inline_single_op_modules=False).source
    nodes, edges = parse_dot(source)
    assert "module.fc" in nodes and "linear_1_1" not in nodes and "(x4)" in source
    assert 'label="passes 2-4"' in _edge(edges, "mul_1_3", "module.fc")[3]
    assert 'label="pass 1"' in _edge(edges, "input_1_0", "module.fc")[3]


def test_bool_node_and_if_edge():
    history = _history(Conditional, 2, 3)
    source = build_dot(history).source
    fill, border = style.COLORS["bool"]
    bool_line = next(line for line in source.splitlines() if line.strip().startswith("gt_1_2 ["))
    assert f'fillcolor="{fill}"' in bool_line and "used as a condition" in bool_line
    _, edges = parse_dot(source)
    assert "style=dashed" in _edge(edges, "gt_1_2", "mul_1_3")[3] and "label=if" in _edge(edges, "gt_1_2", "mul_1_3")[3]
    rolled_edges = parse_dot(build_dot(history, vis_mode="rolled").source)[1]
    assert "label=if" in _edge(rolled_edges, "gt_1_2", "mul_1_3")[3]


def test_node_looks(skip_sub):
    source = build_dot(skip_sub).source
    lines = {line.strip().split(" ")[0]: line for line in source.splitlines() if " [label=<" in line}
    assert style.COLORS["input"][0] in lines["input_1_0"] and "<I>input.x</I>" in lines["input_1_0"]
    assert style.COLORS["output"][0] in lines["output_1_6"]
    assert style.COLORS["params"][0] in lines["linear_1_1"] and "params: 3x3, 3" in lines["linear_1_1"]
    assert "2x3 (24 B)" in lines["relu_1_2"] and "fillcolor" not in lines["relu_1_2"]


def test_created_inside_and_buffer_looks():
    class Inside(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.ones(3))

        def forward(self, x):
            return x + torch.ones(2, 3) + self.offset

    source = build_dot(_history(Inside, 2, 3)).source
    lines = {line.strip().split(" ")[0]: line for line in source.splitlines() if " [label=<" in line}
    assert "dashed" in lines["ones_1_1"]
    assert style.COLORS["buffer"][0] in lines["buffer_1_3"] and "<I>offset</I>" in lines["buffer_1_3"]


# ----- options and overrides -------------------------------------------------------------------------
def test_attribute_overrides_values_and_callables(nested):
    dot = build_dot(
        nested,
        vis_nesting_depth=2,
        direction="leftright",
        graph_attrs={"bgcolor": "ivory", "label": lambda h: h.model_name},
        node_attrs={
            "fontsize": "13",
            "fillcolor": lambda item: "pink" if getattr(item, "layer_type", "") == "add" else None,
        },
        edge_attrs={
            "color": lambda parent, child: "red" if getattr(child, "kind", "") == "output" else None,
            "penwidth": 2,
        },
        module_attrs={"color": lambda address: "blue" if address == "blocks" else None, "style": "dashed"},
    )
    source = dot.source
    assert "bgcolor=ivory" in source and "label=NestedModel" in source and "rankdir=LR" in source
    add_line = next(line for line in source.splitlines() if line.strip().startswith("add_2_8 ["))
    assert "fillcolor=pink" in add_line and "fontsize=13" in add_line
    _, edges = parse_dot(source)
    assert "color=red" in _edge(edges, "linear_5_9", "output_1_10")[3]
    assert "color=red" not in _edge(edges, "input_1_0", "module.blocks.0.mlp.pass1")[3]
    assert all("penwidth=2" in e[3] for e in edges)
    blocks = source[source.index("subgraph cluster_blocks {") :]
    assert "color=blue" in blocks.splitlines()[1] and "style=dashed" in blocks.splitlines()[1]


def test_extra_edges_hook(recurrent):
    extra = [("output_1_4", "input_1_0", {"color": "orange", "style": "dotted"})]
    _, edges = parse_dot(build_dot(recurrent, extra_edges=extra).source)
    assert "color=orange" in _edge(edges, "output_1_4", "input_1_0")[3]
    rolled = parse_dot(build_dot(recurrent, vis_mode="rolled", extra_edges=[("add_1_2:3", "mul_1_3:3", {})]).source)[1]
    assert len([e for e in rolled if e[:2] == ("add_1_2", "mul_1_3")]) == 2  # data edge + extra edge
    with pytest.raises(ValueError, match="not a layer label"):
        build_dot(recurrent, extra_edges=[("nope", "input_1_0", {})])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"vis_mode": "sideways"}, "vis_mode"),
        ({"vis_nesting_depth": -1}, "vis_nesting_depth"),
        ({"vis_nesting_depth": 1.5}, "vis_nesting_depth"),
        ({"direction": "up"}, "direction"),
    ],
)
def test_bad_options(recurrent, options, message):
    with pytest.raises((TypeError, ValueError), match=message):  # a float depth is of the wrong type
        build_dot(recurrent, **options)


def test_progress_bar_option(recurrent, capsys):
    build_dot(recurrent, progress=True)
    assert "building graph" in capsys.readouterr().err


# ----- a history built by hand: the renderer needs no tracing ----------------------------------------
def _entry(label, kind, layer_type, parents=(), stack=(), outputs=(), params=(), address=None):
    e = TensorLogEntry(0, kind, layer_type, None, layer_type)
    e.label = e.layer_label = label
    e.pass_num, e.num_passes = 1, 1
    e.shape, e.dtype, e.nbytes = torch.Size([2, 3]), torch.float32, 24
    e.parent_layers, e.child_layers = list(parents), []
    e.parent_arg_positions = {p: [i] for i, p in enumerate(parents)}
    e.param_addresses = tuple(a for a, _ in params)
    e.param_shapes = [torch.Size(s) for _, s in params]
    e.num_params = sum(torch.Size(s).numel() for _, s in params)
    e.module_stack, e.output_of_modules = tuple(stack), list(outputs)
    e.created_inside_model = False
    e.address = address
    return e


def test_renders_a_hand_built_history():
    entries = [
        _entry("input_1_0", "input", "input", address="input.x"),
        _entry("linear_1_1", "op", "linear", ["input_1_0"], [("enc", 1)], [("enc", 1)], [("enc.w", (3, 3))]),
        _entry("div_1_2", "op", "div", ["linear_1_1", "input_1_0"]),
        _entry("output_1_3", "output", "output", ["div_1_2"], address="output"),
    ]
    for e in entries:
        e.child_layers = [c.label for c in entries if e.label in c.parent_layers]
    modules = ModuleInfo(
        addresses=["enc"],
        types={"": "HandMade", "enc": "Encoder"},
        children={"": ["enc"], "enc": []},
        passes={"enc": 1},
    )
    history = ModelHistory(
        "HandMade", entries, {e.label: e for e in entries}, [e.label for e in entries], modules, {}, 0, 0.0, 0.0
    )
    source = build_dot(history, inline_single_op_modules=False).source
    nodes, edges = parse_dot(source)
    assert nodes["linear_1_1"] == ["cluster_enc"] and "params: 3x3" in source
    assert 'label="arg 1"' in _edge(edges, "input_1_0", "div_1_2")[3]
    collapsed = build_dot(history, vis_nesting_depth=0, inline_single_op_modules=False).source
    assert "module.enc.pass1" in parse_dot(collapsed)[0] and "9 params" in collapsed
    assert "linear_1_1 (x1)" not in build_dot(history, vis_mode="rolled").source


def test_every_catalogue_model_builds():
    import models  # the toy-model catalogue (tests/models.py)

    for name, factory, inputs in models.REGISTRY:
        model = factory()
        if getattr(model, "expected_error", None):
            continue
        args, kwargs = inputs()
        history = tl.log_forward_pass(model, args, kwargs, random_seed=0)
        for mode in ("unrolled", "rolled"):
            for depth in (None, 0):
                source = build_dot(history, vis_mode=mode, vis_nesting_depth=depth).source
                assert source.startswith("digraph"), name


# ----- real files ------------------------------------------------------------------------------------
MAGIC = {"svg": (b"<?xml", b"<svg"), "png": (b"\x89PNG\r\n\x1a\n",), "pdf": (b"%PDF",)}


@needs_dot
@pytest.mark.parametrize("fileformat", ["svg", "png", "pdf"])
def test_render_graph_writes_files(tmp_path, skip_sub, fileformat):
    out = tmp_path / "sub" / "graph"
    dot = render_graph(skip_sub, outpath=str(out), fileformat=fileformat, save_only=True)
    assert isinstance(dot, graphviz.Digraph)
    written = Path(f"{out}.{fileformat}")
    assert written.exists() and written.read_bytes().startswith(MAGIC[fileformat])
    assert sorted(p.name for p in written.parent.iterdir()) == [f"graph.{fileformat}"]  # no DOT file left


@needs_dot
def test_svg_of_and_show_model_graph(tmp_path, recurrent, monkeypatch):
    assert "<svg" in svg_of(recurrent, vis_mode="rolled")
    out = tmp_path / "shown"
    assert (
        show_model_graph(
            SimpleRecurrent(), torch.rand(2, 5), outpath=str(out), fileformat="svg", save_only=True, random_seed=0
        )
        is None
    )
    assert (tmp_path / "shown.svg").read_bytes().startswith(b"<?xml")
    shown = []
    monkeypatch.setattr("torchlens.trace.show.in_notebook", lambda: True)
    monkeypatch.setattr("torchlens.trace.show.display_svg", shown.append)
    monkeypatch.chdir(tmp_path)
    show_model_graph(SimpleRecurrent(), torch.rand(2, 5), vis_mode="rolled")
    assert len(shown) == 1 and "<svg" in shown[0] and not (tmp_path / "graph.pdf").exists()


@needs_dot
def test_render_graph_without_viewer_does_not_fail(tmp_path, recurrent, monkeypatch):
    def no_viewer(*args, **kwargs):
        raise RuntimeError("no viewer")

    monkeypatch.setattr(graphviz, "view", no_viewer)
    render_graph(recurrent, outpath=str(tmp_path / "g"), fileformat="svg", save_only=False)
    assert (tmp_path / "g.svg").exists()


def test_missing_dot_raises_with_install_instructions(tmp_path, recurrent, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot on the PATH
    with pytest.raises(GraphvizNotFoundError) as caught:
        render_graph(recurrent, outpath=str(tmp_path / "g"), fileformat="png", save_only=True)
    assert isinstance(caught.value, RuntimeError)
    for hint in ("sudo apt install graphviz", "brew install graphviz", "conda install -c conda-forge graphviz"):
        assert hint in str(caught.value)
    with pytest.raises(GraphvizNotFoundError):
        svg_of(recurrent)
    assert not (tmp_path / "g.png").exists()
    # the history and the DOT source are still fine
    assert recurrent["linear_1_1:2"].shape == torch.Size([6, 5])
    assert "linear_1_1_pass2" in build_dot(recurrent).source


def test_dot_vanishing_after_the_check_is_reported_the_same_way(recurrent, monkeypatch):
    def gone(*args, **kwargs):
        raise graphviz.ExecutableNotFound(["dot"])

    monkeypatch.setattr(tl_graphviz.shutil, "which", lambda name: "/usr/bin/dot")
    monkeypatch.setattr(graphviz.Digraph, "pipe", gone)
    with pytest.raises(GraphvizNotFoundError, match="brew install graphviz"):
        svg_of(recurrent)


def test_backward_path_drawn_when_gradients_saved():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    h = tl.log_forward_pass(model, torch.rand(2, 3), save_gradients=True, random_seed=0)
    assert "#3b6fb6" not in build_dot(h).source  # no backward yet: nothing to draw
    h[h.output_layers[0]].activation.sum().backward()
    source = build_dot(h).source
    assert source.count("#3b6fb6") == 3 * 2  # output->linear2->relu->linear1: 3 edges, colour + font
    assert "#3b6fb6" not in build_dot(h, show_gradients=False).source


# ----- wide fan-in and fan-out: short labels, junctions, and dot stays fast ----------------------------
class StackedSteps(nn.Module):
    """A sequence model whose step outputs are stacked: every step feeds the stack, and the
    input feeds every step (a wide fan-in and a wide fan-out, both spanning the whole chain)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.RNNCell(3, 3)

    def forward(self, x):
        h = torch.zeros(x.shape[1], 3)
        outs = []
        for t in range(x.shape[0]):
            h = self.cell(x[t], h)
            outs.append(h)
        return torch.stack(outs)


def _steps(n):
    torch.manual_seed(0)
    return tl.get_model_metadata(StackedSteps(), torch.rand(n, 2, 3), random_seed=0)


def test_wide_fan_in_and_out_go_through_junctions():
    from torchlens.trace.render.fans import Junction
    from torchlens.trace.render.structure import build_structure

    s = build_structure(_steps(20))
    into_stack = [e for e in s.edges if e.head.id == "stack_1_4"]
    assert len(into_stack) == 1 and isinstance(into_stack[0].tail.item, Junction)  # was 20 edges
    assert "arg 0[0], arg 0[1], arg 0[2], ..., arg 0[19] (20 in all)" == into_stack[0].label_text(False)
    out_of_input = [e for e in s.edges if e.tail.id == "input_1_0"]
    assert len(out_of_input) == 1 and isinstance(out_of_input[0].head.item, Junction)
    junctions = [n for n in s.nodes.values() if isinstance(n.item, Junction)]
    assert len(junctions) == 40  # one per step on each side: every edge is short
    narrow = build_structure(_steps(4))  # below the threshold nothing changes
    assert len([e for e in narrow.edges if e.head.id == "stack_1_4"]) == 4
    overridden = build_dot(_steps(20), edge_attrs={"color": lambda p, c: "red" if c.label == "stack_1_4" else None})
    assert overridden.source.count("color=red") == 20  # overrides still see (parent, child)


@needs_dot
def test_long_sequences_draw_fast_unrolled_and_rolled():
    import time

    start = time.perf_counter()
    svg_of(_steps(100), progress=False)  # was over 100 s in dot (200 long edges into one node)
    assert time.perf_counter() - start < 30
    rolled = build_dot(_steps(1500), vis_mode="rolled")  # one edge listing 1,500 positions
    assert max(len(line) for line in rolled.source.splitlines()) < 1000
    assert "(1500 in all)" in rolled.source
    assert "<svg" in svg_of(_steps(1500), vis_mode="rolled")  # dot refused labels over 16,384 chars


def test_long_labels_are_elided():
    assert style.positions_text([(0, i) for i in range(6)]) == "arg 0[0], arg 0[1], arg 0[2], ..., arg 0[5] (6 in all)"
    assert style.positions_text([0, 1]) == "arg 0, arg 1"
    assert style.passes_text(range(1, 100, 2)) == "passes 1, 3, 5, ..., 99 (50 in all)"
    assert style.clip("x" * 500).endswith("...") and len(style.clip("x" * 500)) == style.MAX_LABEL_CHARS


@needs_dot
def test_a_note_shows_while_dot_runs_on_large_graphs(recurrent, capsys):
    tl_graphviz.run_dot(build_dot(recurrent), "svg")
    assert "laying out" not in capsys.readouterr().err  # small: silent
    tl_graphviz.run_dot(build_dot(recurrent), "svg", progress=True)
    assert "graphviz's dot is laying out" in capsys.readouterr().err


# ----- one set of option names: those of log_forward_pass ---------------------------------------------
@needs_dot
def test_vis_names_everywhere_and_the_older_names_as_aliases(tmp_path, recurrent):
    out = tmp_path / "new"
    render_graph(recurrent, vis_outpath=str(out), vis_fileformat="svg", vis_save_only=True, vis_direction="topdown")
    assert (tmp_path / "new.svg").exists()
    render_graph(recurrent, outpath=str(tmp_path / "old"), fileformat="svg", save_only=True)  # still accepted
    assert (tmp_path / "old.svg").exists()
    show_model_graph(
        SimpleRecurrent(),
        torch.rand(2, 5),
        vis_outpath=str(tmp_path / "shown"),
        vis_fileformat="svg",
        vis_save_only=True,
    )
    assert (tmp_path / "shown.svg").exists()
    assert build_dot(recurrent, vis_direction="topdown").source == build_dot(recurrent, direction="topdown").source
    assert "rankdir=TB" in build_dot(recurrent, vis_direction="topdown").source
    tl.log_forward_pass(
        SimpleRecurrent(),
        torch.rand(2, 5),
        vis_mode="rolled",
        vis_outpath=str(tmp_path / "log"),
        vis_fileformat="svg",
        vis_save_only=True,
        vis_direction="leftright",
    )
    assert (tmp_path / "log.svg").exists()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda h: render_graph(h, vis_outpath="a", outpath="b"), "got both vis_outpath= and outpath="),
        (lambda h: render_graph(h, vis_save_only=True, save_only=True), "pass only vis_save_only="),
        (lambda h: build_dot(h, vis_direction="topdown", direction="topdown"), "got both vis_direction="),
        (
            lambda h: show_model_graph(SimpleRecurrent(), torch.rand(2, 5), vis_fileformat="svg", fileformat="png"),
            "got both vis_fileformat=",
        ),
        (lambda h: render_graph(h, out_path="x"), "unexpected keyword argument 'out_path'"),
    ],
)
def test_both_spellings_of_an_option_are_a_type_error(recurrent, call, message):
    with pytest.raises(TypeError, match=message):
        call(recurrent)


def test_show_model_graph_html_writes_the_interactive_page(tmp_path, monkeypatch):
    monkeypatch.setattr("torchlens.trace.show.in_notebook", lambda: False)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    assert show_model_graph(model, torch.rand(2, 4), vis_fileformat="html", vis_outpath=str(tmp_path / "g")) is None
    page = (tmp_path / "g.html").read_text()
    assert page.startswith("<!doctype html>") and "linear_1_1" in page


def test_a_misspelt_drawing_keyword_is_refused_before_the_model_runs(tmp_path):
    calls = []

    class Counted(nn.Linear):
        def forward(self, x):
            calls.append(1)
            return super().forward(x)

    with pytest.raises(TypeError, match=r"show_model_graph\(\).*'node_atrs'; did you mean 'node_attrs'\?"):
        tl.show_model_graph(Counted(2, 2), torch.ones(1, 2), vis_outpath=str(tmp_path / "g"), node_atrs={})
    with pytest.raises(TypeError, match=r"'vis_opt'; did you mean 'vis_mode'\?"):
        tl.show_model_graph(Counted(2, 2), torch.ones(1, 2), vis_opt="rolled")
    assert calls == []
    history = tl.log_forward_pass(nn.Linear(2, 2), torch.ones(1, 2))
    with pytest.raises(TypeError, match=r"render_graph\(\).*'vis_opt'; did you mean 'vis_mode'\?"):
        tl.render_graph(history, vis_opt="rolled")
