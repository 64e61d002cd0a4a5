"""Drawing options as one value (issue 39): ``DrawOptions`` and ``GraphStyle`` say the same as the
``vis_*`` and style keywords, are checked when made, and do not mix with the keywords."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.arguments import ArgumentTypeError, ArgumentValueError
from torchlens.trace.render import GraphStyle, build_dot, render_graph, svg_of


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), nn.Linear(3, 2))


@pytest.fixture(scope="module")
def history():
    return tl.log_forward_pass(_model(), torch.ones(1, 3), random_seed=0)


def test_log_forward_pass_draws_the_same_with_draw_as_with_vis_keywords(tmp_path):
    by_keywords, by_value = tmp_path / "keywords", tmp_path / "value"
    tl.log_forward_pass(
        _model(),
        torch.ones(1, 3),
        random_seed=0,
        vis_mode="rolled",
        vis_direction="leftright",
        vis_outpath=str(by_keywords),
        vis_fileformat="svg",
        vis_save_only=True,
    )
    draw = tl.DrawOptions(mode="rolled", direction="leftright", outpath=str(by_value), fileformat="svg", save_only=True)
    tl.log_forward_pass(_model(), torch.ones(1, 3), random_seed=0, draw=draw)
    keywords_svg = (tmp_path / "keywords.svg").read_text()
    assert "rankdir" not in keywords_svg  # an SVG, not DOT source
    assert keywords_svg == (tmp_path / "value.svg").read_text()


def test_no_drawing_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tl.log_forward_pass(_model(), torch.ones(1, 3), vis_outpath="x", vis_fileformat="svg")  # vis_mode not given
    tl.log_forward_pass(_model(), torch.ones(1, 3), vis_mode="none", vis_direction="topdown")
    assert list(tmp_path.iterdir()) == []


def test_draw_and_vis_keywords_together_are_refused(tmp_path):
    draw = tl.DrawOptions(outpath=str(tmp_path / "g"), fileformat="svg", save_only=True)
    with pytest.raises(ArgumentValueError, match=r"draw= and vis_mode=, vis_outpath= both give drawing options"):
        tl.log_forward_pass(_model(), torch.ones(1, 3), draw=draw, vis_mode="rolled", vis_outpath="x")
    with pytest.raises(ArgumentTypeError, match="log_forward_pass: draw takes a torchlens.DrawOptions"):
        tl.log_forward_pass(_model(), torch.ones(1, 3), draw={"mode": "rolled"})
    assert not list(tmp_path.iterdir())  # refused before anything was drawn


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mode": "sideways"}, "DrawOptions: mode takes one of 'unrolled', 'rolled'"),
        ({"mode": "none"}, "DrawOptions: mode takes"),
        ({"nesting_depth": -1}, "DrawOptions: nesting_depth takes an int >= 0"),
        ({"nesting_depth": 1.5}, "DrawOptions: nesting_depth takes"),
        ({"direction": "up"}, "DrawOptions: direction takes one of 'bottomup', 'topdown', 'leftright'"),
        ({"outpath": ""}, "DrawOptions: outpath takes a path"),
        ({"outpath": None}, "DrawOptions: outpath takes a path"),
        ({"fileformat": "nonsense"}, "DrawOptions: fileformat takes a graphviz output format"),
        ({"fileformat": None}, "DrawOptions: fileformat takes a graphviz output format"),
        ({"save_only": "yes"}, "DrawOptions: save_only takes True or False"),
    ],
)
def test_draw_options_are_checked_when_made(fields, message):
    with pytest.raises((ArgumentTypeError, ArgumentValueError), match=message):
        tl.DrawOptions(**fields)


def test_draw_options_is_frozen_and_changes_by_replace():
    draw = tl.DrawOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        draw.mode = "rolled"  # type: ignore[misc]
    assert dataclasses.replace(draw, mode="rolled").keywords()["vis_mode"] == "rolled"
    with pytest.raises(ArgumentValueError, match="DrawOptions: direction"):
        dataclasses.replace(draw, direction="up")


def test_keywords_errors_name_the_keywords(history):
    with pytest.raises(ArgumentValueError, match="log_forward_pass: vis_direction takes one of"):
        tl.log_forward_pass(_model(), torch.ones(1, 3), vis_direction="up")
    with pytest.raises(ArgumentValueError, match="render_graph: vis_mode takes one of 'unrolled', 'rolled'"):
        render_graph(history, vis_mode="none")
    with pytest.raises(TypeError, match="build_dot.. got an unexpected keyword argument 'vis_outpath'"):
        build_dot(history, vis_outpath="x")  # build_dot writes no file


def test_build_dot_and_svg_of_take_the_values(history):
    draw = tl.DrawOptions(mode="rolled", nesting_depth=0, direction="topdown")
    style = GraphStyle(node_attrs={"fillcolor": "pink"}, inline_single_op_modules=False, progress=False)
    by_value = build_dot(history, draw, style).source
    by_keywords = build_dot(
        history,
        vis_mode="rolled",
        vis_nesting_depth=0,
        direction="topdown",
        node_attrs={"fillcolor": "pink"},
        inline_single_op_modules=False,
        progress=False,
    ).source
    assert by_value == by_keywords
    assert "rankdir=TB" in by_value and "fillcolor=pink" in by_value
    assert svg_of(history, draw, style) == svg_of(history, draw=draw, style=style)


def test_render_graph_takes_the_values(history, tmp_path):
    draw = tl.DrawOptions(outpath=str(tmp_path / "value"), fileformat="svg", save_only=True)
    render_graph(history, draw, GraphStyle(graph_attrs={"bgcolor": "white"}))
    render_graph(
        history,
        vis_outpath=str(tmp_path / "keywords"),
        vis_fileformat="svg",
        vis_save_only=True,
        graph_attrs={"bgcolor": "white"},
    )
    assert (tmp_path / "value.svg").read_text() == (tmp_path / "keywords.svg").read_text()


def test_style_and_its_keywords_together_are_refused(history):
    with pytest.raises(ArgumentValueError, match="build_dot: style= and progress= both give the graph's style"):
        build_dot(history, style=GraphStyle(), progress=True)
    with pytest.raises(ArgumentValueError, match="render_graph: draw= and vis_mode= both"):
        render_graph(history, draw=tl.DrawOptions(), vis_mode="rolled")
    with pytest.raises(ArgumentTypeError, match="GraphStyle: node_attrs takes a dict"):
        GraphStyle(node_attrs=5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="build_dot: style takes a torchlens.trace.render.GraphStyle"):
        build_dot(history, style={"progress": True})
