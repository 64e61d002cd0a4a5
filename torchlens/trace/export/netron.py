"""``format="netron"``: the history as an ONNX model (nodes = operations, edges = tensors), in
ONNX's JSON form (``.json``) or, when the ``onnx`` package is installed, as a binary ``.onnx``
file. Netron opens both; ``onnx.checker`` accepts the model.

Operations are not ONNX's own operators: each node is an op of the ``torchlens`` domain named
by its layer type (``linear``, ``add``), with attributes for its function, module, and source
line; its name is its module path and label (``features/features.6/conv2d_3_7``), the
namespace Netron and Model Explorer group by. Every tensor edge carries its shape and dtype.
Parameters are graph inputs by shape (ONNX initializers must hold values); pass
``weights=model`` to store the model's parameter values as initializers instead.

Example:
    >>> import json, pathlib, tempfile, torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), torch.ones(1, 3))
    >>> path = h.export(tempfile.mkdtemp() + "/model.json", format="netron")
    >>> [n["opType"] for n in json.loads(pathlib.Path(path).read_text())["graph"]["node"]]
    ['linear', 'relu', 'output']
"""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, List, Optional

import torch

from ...version import __version__
from ._graph import Node, escape, nodes_of
from ._target import ExportError, require

DOMAIN = "torchlens"
IR_VERSION = 8  # read by onnx >= 1.10 and by Netron
# torch dtype name -> onnx TensorProto.DataType
ELEM_TYPES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
    "complex64": 14,
    "complex128": 15,
    "bfloat16": 16,
    "float8_e4m3fn": 17,
    "float8_e4m3fnuz": 18,
    "float8_e5m2": 19,
    "float8_e5m2fnuz": 20,
}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _string(name: str, text: str) -> Dict[str, Any]:
    return {"name": name, "type": "STRING", "s": _b64(text)}


def _value_info(name: str, shape: Optional[tuple], dtype: str) -> Dict[str, Any]:
    tensor: Dict[str, Any] = {"elemType": ELEM_TYPES.get(dtype, 0)}  # 0: not known (e.g. a parameter's)
    if shape is not None:
        tensor["shape"] = {"dim": [{"dimValue": str(int(d))} for d in shape]}
    return {"name": name, "type": {"tensorType": tensor}}


def _node_name(node: Node) -> str:
    return "/".join([escape(s) for s in node.scopes] + [escape(node.label)])


def _attributes(node: Node) -> List[Dict[str, Any]]:
    attrs = [_string("label", node.label), _string("function", node.func)]
    for name, value in (("module", node.module), ("address", node.address), ("source", node.source)):
        if value:
            attrs.append(_string(name, value))
    if node.code:
        attrs.append(_string("code", node.code))
    if node.missing:  # parents that a layers_to_save subset dropped
        attrs.append({"name": "parents_not_kept", "type": "STRINGS", "strings": [_b64(m) for m in node.missing]})
    return attrs


def _initializer(name: str, value: torch.Tensor) -> Dict[str, Any]:
    dtype = str(value.dtype).replace("torch.", "")
    if dtype not in ELEM_TYPES or dtype.startswith("float8"):
        raise ExportError(f"parameter {name} has dtype {dtype}, which this export cannot store as an initializer.")
    data = value.detach().to("cpu").contiguous()
    raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""  # little-endian, as ONNX stores it
    return {
        "name": name,
        "dims": [str(int(d)) for d in data.shape],
        "dataType": ELEM_TYPES[dtype],
        "rawData": base64.b64encode(raw).decode("ascii"),
    }


def onnx_json(history: Any, weights: Optional[torch.nn.Module] = None) -> Dict[str, Any]:
    """The ONNX model of ``history`` as the JSON form of ``onnx.ModelProto`` (a dict)."""
    nodes = nodes_of(history)
    labels = {n.label for n in nodes}
    values: Dict[str, torch.Tensor] = {}
    if weights is not None:
        if not isinstance(weights, torch.nn.Module):
            raise ExportError(f"weights= takes the traced nn.Module, not {type(weights).__name__}.")
        values = dict(weights.named_parameters(remove_duplicate=False))
        used = {a for n in nodes for a, _ in n.params}
        absent = sorted(used - set(values))
        if absent:
            raise ExportError(
                f"weights= is not the model this history traced: it has no parameter {absent[0]!r}"
                + (f" (nor {len(absent) - 1} more)" if len(absent) > 1 else "")
                + "."
            )
    param_names: Dict[str, str] = {}  # parameter address -> its value's name (an address equal to a label is prefixed)
    graph_inputs: List[Dict[str, Any]] = []
    initializers: List[Dict[str, Any]] = []
    graph_nodes: List[Dict[str, Any]] = []
    value_infos: List[Dict[str, Any]] = []
    outputs: List[Dict[str, Any]] = []
    for node in nodes:
        for address, shape in node.params:
            if address in param_names:
                continue
            name = address if address not in labels else f"param:{address}"
            param_names[address] = name
            if address in values:
                initializers.append(_initializer(name, values[address]))
            else:
                graph_inputs.append(_value_info(name, shape, ""))
        if node.kind == "input":
            graph_inputs.append(_value_info(node.label, node.shape, node.dtype))
            continue
        graph_nodes.append(
            {
                "name": _node_name(node),
                "opType": node.layer_type,
                "domain": DOMAIN,
                "input": node.inputs + [param_names[a] for a, _ in node.params],
                "output": [node.label],
                "attribute": _attributes(node),
            }
        )
        info = _value_info(node.label, node.shape, node.dtype)
        (outputs if node.kind == "output" else value_infos).append(info)
    graph: Dict[str, Any] = {
        "name": history.model_name,
        "node": graph_nodes,
        "input": graph_inputs,
        "output": outputs,
        "valueInfo": value_infos,
    }
    if initializers:
        graph["initializer"] = initializers
    return {
        "irVersion": str(IR_VERSION),
        "producerName": "torchlens",
        "producerVersion": __version__,
        "opsetImport": [{"domain": DOMAIN, "version": "1"}],
        "graph": graph,
        "metadataProps": [{"key": "torchlens.model", "value": history.model_name}],
    }


def write_netron(
    history: Any, path: str, weights: Optional[torch.nn.Module] = None, binary: Optional[bool] = None
) -> None:
    """Write the ONNX model of ``history`` to ``path``: binary ONNX (``binary``; default: a
    ``.onnx`` path; needs the ``onnx`` package), else ONNX's JSON form. Checked by
    ``onnx.checker`` when ``onnx`` is installed."""
    model = onnx_json(history, weights)
    binary = path.lower().endswith(".onnx") if binary is None else binary
    onnx = require("onnx", "onnx", "writing an .onnx file") if binary else _optional_onnx()
    if onnx is not None:
        from google.protobuf import json_format  # onnx depends on protobuf

        proto = json_format.ParseDict(model, onnx.ModelProto())
        onnx.checker.check_model(proto)
        if binary:
            with open(path, "wb") as f:
                f.write(proto.SerializeToString())
            return
    with open(path, "w", encoding="utf-8") as f:
        json.dump(model, f, indent=1)


def _optional_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        return None
    return onnx
