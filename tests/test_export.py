"""history.export: each format read back by its own reader (onnx, JSON schemas of Model
Explorer's graph and of the Trace Event Format, pyarrow/pandas/duckdb), and the bad inputs."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.export import ExportError, ExportExistsError, MissingPackageError, explorer_json, trace_events

jsonschema = pytest.importorskip("jsonschema")


class Net(nn.Module):
    """Nested modules, a buffer (batch norm), a branch and a parameter used outside a module."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.block = nn.Sequential(nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4))
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        h = self.stem(x)
        return self.block(h) * self.scale + h


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.cell(x))
        return x


class Odd(nn.Module):
    """Module names holding quotes, slashes and HTML."""

    def __init__(self):
        super().__init__()
        self.parts = nn.ModuleDict({'a/b"<i>': nn.Linear(2, 2), "c'&</script>": nn.ReLU()})

    def forward(self, x):
        return self.parts["c'&</script>"](self.parts['a/b"<i>'](x))


def _history(model=None, **options):
    torch.manual_seed(0)
    model = model if model is not None else Net()
    return tl.log_forward_pass(model, torch.rand(2, 3 if not isinstance(model, Odd) else 2), random_seed=0, **options)


def _histories():
    """The kinds of history an export must describe."""
    yield "full", _history()
    yield "structure only", _history(layers_to_save=None)
    yield "meta", _history(device="meta")
    yield "recurrent", _history(Recurrent())
    yield "odd names", _history(Odd())
    yield "subset", _history(layers_to_save=["relu"])


# ----- netron (ONNX) ----------------------------------------------------------------------------
def test_netron_json_is_an_onnx_model_the_checker_accepts(tmp_path):
    onnx = pytest.importorskip("onnx")
    from google.protobuf import json_format

    for name, h in _histories():
        path = h.export(tmp_path / f"{name}.json", format="netron")
        document = json.loads(path_text(path))
        model = json_format.ParseDict(document, onnx.ModelProto())
        onnx.checker.check_model(model, full_check=True)
        graph = model.graph
        ops = [e for e in h.layer_list if e.kind != "input"]
        assert [n.output[0] for n in graph.node] == [e.label for e in ops], name
        assert [i.name for i in graph.input if i.name in h.layer_labels] == h.input_layers
        assert [o.name for o in graph.output] == h.output_layers


def path_text(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_netron_nodes_edges_and_parameters(tmp_path):
    onnx = pytest.importorskip("onnx")
    h = _history()
    model = onnx.load(h.export(tmp_path / "net.onnx"))
    onnx.checker.check_model(model, full_check=True)
    nodes = {n.output[0]: n for n in model.graph.node}
    linear = nodes["linear_2_6"]
    assert linear.op_type == "linear" and linear.domain == "torchlens"
    assert linear.name == "block/block.2/linear_2_6"  # the module path is the namespace
    assert list(linear.input) == [h["linear_2_6"].parent_layers[0], "block.2.weight", "block.2.bias"]
    attrs = {a.name: a.s.decode() for a in linear.attribute}
    assert attrs["module"] == "block.2" and attrs["source"].endswith(".py:" + attrs["source"].rsplit(":", 1)[1])
    assert "self.block(h)" in attrs["code"]  # the model's line, not torch's Linear.forward
    # every edge is a tensor with its shape and dtype
    infos = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    for entry in h.layer_list:
        if entry.kind == "input":
            continue
        dims = [d.dim_value for d in infos[entry.label].type.tensor_type.shape.dim]
        assert dims == list(entry.shape), entry.label
    assert infos["relu_1_5"].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    # parameters by shape only (no values): graph inputs, no initializers
    params = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert params["stem.weight"] == [4, 3] and params["scale"] == [4]
    assert not model.graph.initializer


def test_netron_with_weights_stores_the_parameter_values(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    torch.manual_seed(0)
    net = Net()
    h = tl.log_forward_pass(net, torch.rand(2, 3))
    model = onnx.load(h.export(tmp_path / "net.onnx", weights=net))
    onnx.checker.check_model(model, full_check=True)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert set(values) == {n for n, _ in net.named_parameters()}
    for name, p in net.named_parameters():
        assert torch.equal(torch.from_numpy(values[name].copy()), p.detach()), name
    with pytest.raises(ExportError, match="not the model this history traced"):
        h.export(tmp_path / "other.onnx", weights=nn.Linear(3, 4))
    with pytest.raises(ExportError, match="goes with format='netron'"):
        h.export(tmp_path / "t.json", format="chrome_trace", weights=net)


def test_a_binary_onnx_file_needs_the_onnx_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if it were not installed
    h = _history()
    with pytest.raises(MissingPackageError, match=r"torchlens\[onnx\]"):
        h.export(tmp_path / "net.onnx")
    assert not list(tmp_path.iterdir())  # nothing half-written
    path = h.export(tmp_path / "net.json", format="netron")  # the JSON form needs nothing
    assert json.loads(path_text(path))["graph"]["name"] == "Net"


# ----- Model Explorer ---------------------------------------------------------------------------
KEY_VALUES = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["key", "value"],
        "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
    },
}
EXPLORER_SCHEMA = {  # Model Explorer's GraphCollection (its input_graph.ts), the fields written
    "type": "object",
    "required": ["label", "graphs"],
    "properties": {
        "label": {"type": "string"},
        "graphs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "nodes"],
                "properties": {
                    "id": {"type": "string"},
                    "groupNodeAttributes": {
                        "type": "object",
                        "additionalProperties": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    "nodes": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["id", "label", "namespace"],
                            "properties": {
                                "id": {"type": "string"},
                                "label": {"type": "string"},
                                "namespace": {"type": "string"},
                                "attrs": KEY_VALUES,
                                "incomingEdges": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["sourceNodeId", "sourceNodeOutputId", "targetNodeInputId"],
                                        "properties": {
                                            k: {"type": "string"}
                                            for k in ("sourceNodeId", "sourceNodeOutputId", "targetNodeInputId")
                                        },
                                    },
                                },
                                "outputsMetadata": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["id", "attrs"],
                                        "properties": {"id": {"type": "string"}, "attrs": KEY_VALUES},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_model_explorer_graph_has_the_format_and_the_module_nesting(tmp_path):
    for name, h in _histories():
        document = json.loads(path_text(h.export(tmp_path / f"{name}.json", format="model_explorer")))
        jsonschema.validate(document, EXPLORER_SCHEMA)
        graph = document["graphs"][0]
        ids = [n["id"] for n in graph["nodes"]]
        assert len(set(ids)) == len(ids) == len(h.layer_list), name
        seen = set()
        for node in graph["nodes"]:  # edges point at earlier nodes: the graph is acyclic, in order
            assert all(e["sourceNodeId"] in seen for e in node["incomingEdges"]), (name, node["id"])
            seen.add(node["id"])
            parts = node["namespace"].split("/") if node["namespace"] else []
            for depth in range(len(parts)):  # every enclosing module box has its attributes
                assert "/".join(parts[: depth + 1]) in graph["groupNodeAttributes"], (name, node["namespace"])
    graph = explorer_json(_history())["graphs"][0]
    by_label = {dict((a["key"], a["value"]) for a in n["attrs"])["label"]: n for n in graph["nodes"]}
    assert by_label["relu_1_5"]["namespace"] == "block/block.1"
    assert graph["groupNodeAttributes"]["block/block.1"] == {"module": "block.1", "call": "block.1", "type": "ReLU"}
    shapes = {a["key"]: a["value"] for a in by_label["relu_1_5"]["outputsMetadata"][0]["attrs"]}
    assert shapes["tensor_shape"] == "float32[2,4]"


def test_names_with_slashes_stay_one_namespace_segment(tmp_path):
    graph = explorer_json(_history(Odd()))["graphs"][0]
    namespaces = [n["namespace"] for n in graph["nodes"] if n["namespace"]]
    # ModuleDict keys (the dict itself is never called): one segment each, the slash escaped
    assert set(namespaces) == {'parts.a%2Fb"<i>', "parts.c'&<%2Fscript>"}
    path = tmp_path / "odd.json"
    _history(Odd()).export(path, format="model_explorer")
    assert json.loads(path_text(path)) == json.loads(json.dumps(explorer_json(_history(Odd()))))


def test_a_recurrent_model_has_a_node_per_pass():
    h = _history(Recurrent())
    graph = explorer_json(h)["graphs"][0]
    labels = [dict((a["key"], a["value"]) for a in n["attrs"])["label"] for n in graph["nodes"]]
    assert ["linear_1_1:1", "linear_1_1:2", "linear_1_1:3"] == [x for x in labels if x.startswith("linear")]
    namespaces = {n["namespace"] for n in graph["nodes"] if n["label"] == "linear"}
    assert namespaces == {"cell:1", "cell:2", "cell:3"}  # each pass of the module is its own box


# ----- Chrome trace / Perfetto ------------------------------------------------------------------
TRACE_SCHEMA = {  # the Trace Event Format's JSON object form, the events written
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "traceEvents": {
            "type": "array",
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["name", "ph", "ts", "dur", "pid", "tid"],
                        "properties": {
                            "name": {"type": "string"},
                            "cat": {"type": "string"},
                            "ph": {"const": "X"},
                            "ts": {"type": "number", "minimum": 0},
                            "dur": {"type": "number", "minimum": 0},
                            "pid": {"type": "integer"},
                            "tid": {"type": "integer"},
                            "args": {"type": "object"},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["name", "ph", "pid", "args"],
                        "properties": {
                            "name": {"enum": ["process_name", "thread_name", "thread_sort_index"]},
                            "ph": {"const": "M"},
                        },
                    },
                ]
            },
        },
    },
}


def _nested(slices) -> bool:
    """Slices on one track nest (a slice ends within the one it starts in), as Perfetto requires
    (times in whole nanoseconds, as Perfetto reads them)."""
    spans = sorted((round(s["ts"] * 1000), round(s["dur"] * 1000)) for s in slices)
    open_ends = []
    for ts, dur in sorted(spans, key=lambda x: (x[0], -x[1])):
        while open_ends and ts >= open_ends[-1]:
            open_ends.pop()
        if open_ends and ts + dur > open_ends[-1]:
            return False
        open_ends.append(ts + dur)
    return True


def test_chrome_trace_has_a_slice_per_op_on_a_track_per_module_depth(tmp_path):
    for name, h in _histories():
        document = json.loads(path_text(h.export(tmp_path / f"{name}.json", format="chrome_trace")))
        jsonschema.validate(document, TRACE_SCHEMA)
        slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
        ops = [e for e in slices if e["cat"] == "op"]
        assert [e["name"] for e in ops] == [x.label for x in h.layer_list if x.kind == "op"], name
        for tid in {e["tid"] for e in slices}:
            assert _nested([e for e in slices if e["tid"] == tid]), (name, tid)
    h = _history()
    events = {e["name"]: e for e in trace_events(h)["traceEvents"] if e["ph"] == "X"}
    relu = events["relu_1_5"]
    assert relu["tid"] == 2 and relu["args"]["module"] == "block.1" and relu["args"]["shape"] == [2, 4]
    assert relu["dur"] == pytest.approx(h["relu_1_5"].elapsed * 1e6, abs=1e-3)
    block = events["block"]  # the module call's slice spans its operations
    assert block["tid"] == 1 and block["ts"] <= relu["ts"] and relu["ts"] + relu["dur"] <= block["ts"] + block["dur"]
    assert events["mul_1_7"]["tid"] == 0  # the model's own forward: track 0
    assert "self.block(h)" in events["linear_2_6"]["args"]["code"]


# ----- Parquet ----------------------------------------------------------------------------------
def test_parquet_round_trips_through_pyarrow_pandas_and_duckdb(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pd = pytest.importorskip("pandas")
    for name, h in _histories():
        path = h.export(tmp_path / f"{name}.parquet")
        table = pq.read_table(path)
        assert table.column("label").to_pylist() == h.layer_labels, name
        frame = pd.read_parquet(path)
        expected = h.to_pandas()
        assert list(frame.columns[: len(expected.columns)]) == list(expected.columns)
        assert frame["nbytes"].tolist() == expected["nbytes"].tolist()
        assert [list(s) if s is not None else None for s in frame["shape"]] == [
            list(s) if s is not None else None for s in expected["shape"]
        ]
    duckdb = pytest.importorskip("duckdb")
    path = _history().export(tmp_path / "ops.parquet", overwrite=True)
    rows = duckdb.sql(
        f"SELECT label, shape, containing_module FROM read_parquet('{path}') WHERE layer_type = 'relu'"
    ).fetchall()
    assert rows == [("relu_1_5", [2, 4], "block.1")]


def test_a_loaded_history_exports_the_same(tmp_path):
    pytest.importorskip("pyarrow")
    h = _history()
    loaded = tl.load(h.save(str(tmp_path / "saved")))
    assert explorer_json(loaded) == explorer_json(h)
    ops = [(e["name"], e["tid"], e["args"].get("code")) for e in trace_events(loaded)["traceEvents"] if e["ph"] == "X"]
    assert ops == [
        (e["name"], e["tid"], e["args"].get("code")) for e in trace_events(h)["traceEvents"] if e["ph"] == "X"
    ]
    a = h.export(tmp_path / "a.parquet")
    b = loaded.export(tmp_path / "b.parquet")
    import pyarrow.parquet as pq

    assert pq.read_table(a).drop(["has_saved_activation"]).equals(pq.read_table(b).drop(["has_saved_activation"]))


# ----- bad input --------------------------------------------------------------------------------
def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path):
    h = _history()
    target = tmp_path / "trace.json"
    target.write_text("mine")
    with pytest.raises(ExportExistsError, match="overwrite=True"):
        h.export(target, format="chrome_trace")
    assert target.read_text() == "mine"
    h.export(target, format="chrome_trace", overwrite=True)
    assert "traceEvents" in json.loads(target.read_text())
    with pytest.raises(ExportError, match="is a folder"):
        h.export(tmp_path, format="chrome_trace")


def test_an_unknown_format_lists_the_known_ones(tmp_path):
    h = _history()
    with pytest.raises(ExportError, match="netron, model_explorer, chrome_trace, parquet"):
        h.export(tmp_path / "x.json", format="svg")
    with pytest.raises(ExportError, match="pass format="):
        h.export(tmp_path / "x.json")
    assert not list(tmp_path.iterdir())


def test_a_subset_history_names_the_parents_it_did_not_keep():
    h = _history(layers_to_save=["relu"])
    assert h.layer_labels == ["relu_1_5"]
    node = explorer_json(h)["graphs"][0]["nodes"][0]
    attrs = dict((a["key"], a["value"]) for a in node["attrs"])
    assert attrs["parents not kept"] == "batchnorm_1_4" and node["incomingEdges"] == []


def test_the_nesting_check_sees_overlapping_slices():
    inside = [{"ts": 0.0, "dur": 2.0}, {"ts": 0.5, "dur": 1.0}, {"ts": 1.5, "dur": 0.5}]
    assert _nested(inside)
    assert not _nested([{"ts": 0.0, "dur": 2.0}, {"ts": 1.5, "dur": 1.0}])
