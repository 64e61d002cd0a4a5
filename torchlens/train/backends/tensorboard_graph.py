"""The module-call graph of a watched run as a TensorBoard graph (its "Graphs" tab).

TensorBoard groups nodes by ``/`` in their names, so each call that has children becomes a box
(``ResNet/layer1/layer1.0``) that opens on a double click, like the explorer page's drill-down.
Inside a call: one node per input and output (``input 0``, ``output 0``) and one per child call;
a leaf call is one node whose op is its class name. An edge of the run's graph into a call that
has children goes to each of its inputs, and one out of it leaves from each of its outputs (the
run records which calls are connected, not through which of their inputs and outputs).
Shapes from the first logged pass are on the edges, ``extra_repr()`` on the nodes.

Example:
    >>> import torch, tempfile, torchlens as tl
    >>> from torchlens.train.backends.tensorboard_graph import graph_def
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    >>> with tl.watch(model, backend=None, run_dir=tempfile.mkdtemp(), verbose=False) as w:
    ...     model(torch.rand(2, 3)).sum().backward()
    >>> sorted(n.name for n in graph_def(tl.open_run(w.run_dir).calls).node)
    ['Sequential/0', 'Sequential/1', 'Sequential/input 0', 'Sequential/output 0']
"""

from __future__ import annotations

from typing import Dict, List

from ..model import Call


def _scope_names(calls: Dict[str, Call]) -> Dict[str, str]:
    """Call id -> its node name (a leaf) or scope (a call with children)."""
    calls_of: Dict[str, int] = {}
    for call in calls.values():
        calls_of[call.address] = calls_of.get(call.address, 0) + 1
    names: Dict[str, str] = {}
    for call_id, call in calls.items():  # parents come before their children
        if call.parent is None:
            names[call_id] = call.class_name or "model"
            continue
        inside = calls[call.parent].address
        short = call.address[len(inside) + 1 :] if inside and call.address.startswith(inside + ".") else call.address
        if calls_of[call.address] > 1:  # a module called several times: one node per call
            short += f" (call {call_id.rsplit(':', 1)[-1]})"  # never ':', TensorBoard's port separator
        names[call_id] = f"{names[call.parent]}/{short}"
    return names


def graph_def(calls: Dict[str, Call]):
    """A ``GraphDef`` of the run's calls (see the module docstring)."""
    from tensorboard.compat.proto.attr_value_pb2 import AttrValue
    from tensorboard.compat.proto.graph_pb2 import GraphDef
    from tensorboard.compat.proto.node_def_pb2 import NodeDef
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    names = _scope_names(calls)
    nodes: Dict[str, NodeDef] = {}

    def shape_attr(shapes: List[List[int]]) -> AttrValue:
        return AttrValue(
            list=AttrValue.ListValue(
                shape=[TensorShapeProto(dim=[TensorShapeProto.Dim(size=int(d)) for d in s]) for s in shapes]
            )
        )

    def node(name: str, op: str, shapes: List[List[int]], text: str = "") -> NodeDef:
        n = nodes.get(name)
        if n is None:
            n = nodes[name] = NodeDef(name=name, op=op)
            n.attr["_output_shapes"].CopyFrom(shape_attr(shapes))
            if text:
                n.attr["extra_repr"].CopyFrom(AttrValue(s=text.encode()))
        return n

    def ends(call_id: str, side: str) -> List[str]:
        """The nodes an edge into (side 'inputs') or out of (side 'outputs') a call attaches to."""
        call = calls[call_id]
        if not call.children:
            return [names[call_id]]
        return [f"{names[call_id]}/{port}" for port, _ in getattr(call, side)]

    for call_id, call in calls.items():  # every node first: an edge may point into a later call
        scope = names[call_id]
        if not call.children:
            node(scope, call.class_name, [shape for _, shape in call.outputs], call.extra_repr)
            continue
        for port, shape in call.inputs:
            node(f"{scope}/{port}", "Input", [shape])
        for port, shape in call.outputs:
            node(f"{scope}/{port}", "Output", [shape])
    for call_id, call in calls.items():
        scope = names[call_id]
        for source, target in call.edges:
            tails = ends(source, "outputs") if source in calls else [f"{scope}/{source}"]
            heads = ends(target, "inputs") if target in calls else [f"{scope}/{target}"]
            for head in heads:
                for tail in tails:
                    if head in nodes and tail in nodes and tail not in nodes[head].input:
                        nodes[head].input.append(tail)
    return GraphDef(node=list(nodes.values()))


__all__ = ["graph_def"]
