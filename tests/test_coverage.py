"""No silent holes: every tensor a model computes is logged, or the gap is reported.

* Paths beyond the public torch functions are logged: fused fast paths (private torch
  functions), ``torch.ops`` (aten, torchvision, ``torch.library`` custom operators),
  ``torch.sparse``, ``torch.nested``, functorch transforms, parametrizations.
* The safety net: a tensor that reaches a logged operation, a module's output or the model's
  output without a record, and did not exist before the pass, becomes an ``untraced`` node
  (printed, drawn, in ``to_pandas``), and ``validate_model_activations`` returns False naming it.
"""

from __future__ import annotations

import dataclasses
import gc
from types import SimpleNamespace

import models_paths
import pytest
import torch
from torch import nn
from trace_holes import holes, tensors_alive, tensors_in_arguments

import torchlens as tl
from torchlens.trace.records.tensor_log import ParentRef
from torchlens.trace.render import build_dot

NESTED_WARNING = "ignore:The PyTorch API of nested tensors:UserWarning"


def log_checked(model, *args, **kwargs):
    """Log with function arguments and assert the ground truth finds no hole."""
    alive = tensors_alive()
    h = tl.log_forward_pass(model, list(args), kwargs or None, random_seed=0, save_function_args=True)
    assert holes(h, alive) == []
    return h


def types_of(h):
    return [e.layer_type for e in h]


def encoder(nested: bool) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=nested).eval()


def padded(batch=2, length=5, d=16):
    x = torch.randn(batch, length, d, generator=torch.Generator().manual_seed(1))
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, -2:] = True
    return x, padding


# ----- fused fast paths --------------------------------------------------------------------------
@pytest.mark.filterwarnings(NESTED_WARNING)
@pytest.mark.parametrize("nested", [False, True])
def test_transformer_encoder_fast_path_eval_no_grad(nested):
    """Eval + no_grad: torch runs one fused kernel per layer. That kernel is what ran (its
    internals never exist as tensors), so it is one node per layer, fed by the previous one."""
    model = encoder(nested)
    x, padding = padded()
    with torch.no_grad():
        h = log_checked(model, x, src_key_padding_mask=padding)
        fused = [e for e in h if e.layer_type == "transformerencoderlayerfwd"]
        assert len(fused) == 2
        assert fused[0].containing_module == "layers.0" and fused[1].containing_module == "layers.1"
        assert "layers.0.self_attn.in_proj_weight" in fused[0].param_addresses
        assert fused[1].parent_layers[0] == fused[0].label
        assert h[h.output_layers[0]].parent_layers  # the output is connected to the pass
        if nested:  # padding dropped, layers on a nested tensor, padded again
            assert "nestedtensorfrommask" in types_of(h) and "topaddedtensor" in types_of(h)
            assert fused[0].shape == (2, None, 16)
        assert tl.validate_model_activations(model, [x], {"src_key_padding_mask": padding}, random_seed=0, verbose=True)


def test_multihead_attention_fast_path():
    torch.manual_seed(0)
    model = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x, _ = padded()
    with torch.no_grad():
        h = log_checked(model, x, x, x, need_weights=False)
        attention = h["nativemultiheadattention_1"]
        assert attention.parent_arg_positions == {"input_1_0": [0, 1, 2]}  # query, key, value
        assert set(attention.param_addresses) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}
        assert tl.validate_model_activations(model, [x, x, x], {"need_weights": False}, random_seed=0)


def test_weight_norm():
    """``parametrizations.weight_norm`` and ``torch._weight_norm`` called directly."""

    class Direct(nn.Module):
        def __init__(self):
            super().__init__()
            self.v = nn.Parameter(torch.randn(3, 4))
            self.g = nn.Parameter(torch.rand(3, 1))

        def forward(self, x):
            return x @ torch._weight_norm(self.v, self.g, 0).t()

    x = torch.randn(2, 4)
    h = log_checked(Direct(), x)
    assert h["weightnorm_1"].param_addresses == ("v", "g")
    assert h["weightnorm_1"].child_layers == ["t_1_2"]

    h = log_checked(models_paths.WeightNormLinear(), x)
    norm = h["weightnorm_1"]
    assert norm.param_addresses == ("fc.parametrizations.weight.original1", "fc.parametrizations.weight.original0")
    assert norm.child_layers == ["linear_1_2"]
    assert tl.validate_model_activations(models_paths.WeightNormLinear(), x, random_seed=0)


def test_pack_padded_sequence():
    """``torch._VF._pack_padded_sequence`` (a private aten function) feeds the LSTM."""

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 4, batch_first=True)

        def forward(self, x, lengths):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            return nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True)[0]

    x, lengths = torch.randn(3, 5, 3), torch.tensor([5, 2, 4])
    h = log_checked(Packed(), x, lengths)
    pack = h["packpaddedsequence_1"]
    assert h[pack.parent_layers[0]].layer_type in ("indexselect", "input")
    assert "lstm_1" in [h[c].short_label for c in pack.child_layers]
    batch_sizes = h["packpaddedsequence_2"]  # the second output of the same call
    assert batch_sizes.parent_layers == [h["sort_1"].label]  # from the (sorted) lengths only
    assert tl.validate_model_activations(Packed(), [x, lengths], random_seed=0, verbose=True)


# ----- torch.ops ---------------------------------------------------------------------------------
def test_roi_align_and_nms():
    """``torch.ops.torchvision``: the box head stays connected to the backbone."""
    model = models_paths.RoiAlignNms()
    image, boxes = torch.rand(1, 3, 10, 10), torch.tensor([[0.0, 0, 6, 6], [1, 1, 7, 7], [4, 2, 9, 9]])
    h = log_checked(model, image, boxes)
    roi = h["roialign_1"]
    assert roi.func is torch.ops.torchvision.roi_align and roi.func_name == "roi_align"
    assert roi.parent_layers[0] == "conv2d_1_2"
    nms = h["nms_1"]
    assert nms.parent_layers == ["input_2_1", h["mean_1"].label] and nms.dtype == torch.int64
    assert h.layer_labels.index(roi.label) < h.layer_labels.index(nms.label)
    assert tl.validate_model_activations(model, [image, boxes], random_seed=0, verbose=True)


def test_aten_operators():
    h = log_checked(models_paths.AtenOps(), torch.randn(2, 3))
    add = h["add_1"]
    assert add.func is torch.ops.aten.add.Tensor
    assert add.parent_layers == ["input_1_0", "exp_1_1"]
    assert h["mul_1"].func is torch.ops.aten.mul and h["mul_1"].parent_layers == [add.label]
    inplace = h["add_2"]
    assert inplace.is_inplace and inplace.func_name == "add_" and inplace.parent_layers == ["mul_1_3"]
    assert h["relu_1"].parent_layers == [inplace.label]
    assert tl.validate_model_activations(models_paths.AtenOps(), torch.randn(2, 3), random_seed=0)


def test_custom_operator_is_one_node():
    """A ``torch.library`` operator is one node, its own kernel's operations are not logged."""
    model = models_paths.CustomOp()
    x = torch.randn(2, 4)
    h = log_checked(model, x)
    assert types_of(h) == ["input", "linear", "sin", "scaleshift", "tanh", "output"]
    op = h["scaleshift_1"]
    assert op.func is torch.ops.torchlens_catalogue.scale_shift.default
    assert op.parent_layers == ["linear_1_1", "sin_1_2"]

    lib = torch.library.Library("torchlens_coverage", "DEF")  # the older way to register one
    try:
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda t: t * 2, "CompositeExplicitAutograd")

        class UsesLibrary(nn.Module):
            def forward(self, x):
                return torch.ops.torchlens_coverage.twice(x.cos()) + 1

        h = log_checked(UsesLibrary(), x)
        assert types_of(h) == ["input", "cos", "twice", "add", "output"]
        assert tl.validate_model_activations(UsesLibrary(), x, random_seed=0)
    finally:
        lib._destroy()
    assert tl.validate_model_activations(model, x, random_seed=0)


# ----- torch.sparse, torch.nested ----------------------------------------------------------------
def test_sparse_mm():
    x = torch.randn(3, 3)
    h = log_checked(models_paths.SparseMatmul(), x)
    mm = h["sparsemm_1"]
    assert mm.func is torch.sparse.mm and mm.parent_layers == ["tosparse_1_3", "t_1_4"]
    assert h["tosparse_1"].parent_layers == ["mul_1_2"]
    assert tl.validate_model_activations(models_paths.SparseMatmul(), x, random_seed=0, verbose=True)


@pytest.mark.filterwarnings(NESTED_WARNING)
def test_nested_tensor_functions():
    class Nested(nn.Module):
        def forward(self, a, b):
            nested = torch.nested.nested_tensor([a.relu(), b])
            return torch.nested.to_padded_tensor(nested * 2, 0.0)

    a, b = torch.randn(2, 3), torch.randn(4, 3)
    h = log_checked(Nested(), a, b)
    assert types_of(h) == ["input", "input", "relu", "nestedtensor", "mul", "nestedtopaddedtensor", "output"]
    assert h["nestedtensor_1"].parent_layers == ["relu_1_2", "input_2_1"]
    assert h["nestedtensor_1"].shape == (2, None, 3)
    assert tl.validate_model_activations(Nested(), [a, b], random_seed=0, verbose=True)


# ----- functorch ---------------------------------------------------------------------------------
def test_vmap_is_one_node():
    """The vmapped function runs on batched tensors that must not escape: one node per call,
    also for a function vmapped before the pass."""
    model = models_paths.Vmapped()
    x = torch.randn(4, 3)
    h = log_checked(model, x)
    assert types_of(h) == ["input", "linear", "vmap", "vmap", "mul", "output"]
    assert h["vmap_1"].parent_layers == ["linear_1_1"] and h["vmap_2"].parent_layers == ["vmap_1_2"]
    assert tl.validate_model_activations(model, x, random_seed=0)


def test_func_transforms():
    class Transforms(nn.Module):
        def forward(self, x):
            g = torch.func.grad(lambda v: (v**3).sum())(x)
            out, vjp_fn = torch.func.vjp(torch.cos, x)
            (cotangent,) = vjp_fn(torch.ones_like(out))
            primal, tangent = torch.func.jvp(torch.exp, (x,), (torch.ones_like(x),))
            jacobian = torch.func.jacrev(torch.sin)(x[0])
            return g + cotangent + primal * tangent, jacobian

    x = torch.randn(2, 3)
    h = log_checked(Transforms(), x)
    assert h["grad_1"].parent_layers == ["input_1_0"]
    assert h["vjpfn_1"].parent_layers == ["oneslike_1_3"]
    primal, tangent = h["jvp_1"], h["jvp_2"]
    assert primal.parent_layers == ["input_1_0"]  # the tangents do not change f(primals)
    assert tangent.parent_layers == ["input_1_0", "oneslike_2_5"]
    assert "vmap" in types_of(h)  # jacrev: the vjp, then a vmap over the basis
    assert tl.validate_model_activations(Transforms(), x, random_seed=0, verbose=True)


# ----- the safety net ----------------------------------------------------------------------------
class Unwrapped(nn.Module):
    """Computes through ``torch._C._VariableFunctions``, the raw bindings behind ``torch.*``,
    which torchlens deliberately leaves alone (models never call them; a C extension would be
    the same case)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((3,), 2.0))
        self.block = nn.Sequential(nn.Linear(3, 3), nn.ReLU())

    def forward(self, x):
        hidden = torch._C._VariableFunctions.exp(x * self.scale)
        return self.block(hidden) + 1


def test_untraced_producer_is_visible():
    model, x = Unwrapped(), torch.randn(2, 3)
    alive = tensors_alive()
    h = tl.log_forward_pass(model, x, random_seed=0, save_function_args=True)
    assert h.layer_labels == ["input_1_0", "mul_1_1", "untraced_1_2", "linear_1_3", "relu_1_4", "add_1_5", "output_1_6"]
    gap = h["untraced_1_2"]
    assert gap.is_untraced and gap.kind == "untraced" and h.untraced_layers == ["untraced_1_2"]
    assert gap.parent_layers == [] and gap.child_layers == ["linear_1_3"]
    assert h["linear_1_3"].parent_layers == ["untraced_1_2"]
    torch.testing.assert_close(gap.activation.detach(), torch.exp(x * 2))
    assert "ExpBackward0" in gap.untraced_reason and gap.func is None
    assert not gap.created_inside_model and not h["linear_1_3"].created_inside_model
    # the ground truth agrees: this is the one hole
    assert holes(h, alive) == [f"untraced_1_2: untraced producer ({gap.untraced_reason})"]

    assert "WARNING: 1 tensor comes from untraced producers" in str(h) and "untraced_1_2" in str(h)
    assert "Untraced producer: its grad_fn ExpBackward0 was made by an operation" in str(gap)
    assert "First used inside module: block.0" in str(gap)
    row = h.to_pandas().set_index("label").loc["untraced_1_2"]
    assert row["kind"] == "untraced" and "ExpBackward0" in row["untraced_reason"]
    for depth in (None, 0):  # drawn in its own style, also when its module is collapsed
        source = build_dot(h, vis_nesting_depth=depth).source
        node = next(line for line in source.splitlines() if line.strip().startswith("untraced_1_2 ["))
        assert "shape=octagon" in node and "untraced producer" in node


def test_validate_names_the_untraced_producer(capsys):
    x = torch.randn(2, 3)
    assert tl.validate_model_activations(Unwrapped(), x, random_seed=0, verbose=True) is False
    report = capsys.readouterr().out
    assert "untraced_1_2: untraced producer inside module 'block.0', used by linear_1_3" in report
    assert "ExpBackward0" in report and "torch.library custom operator" in report
    with torch.no_grad():  # without autograd the reason is the tensor's unknown origin
        assert not tl.validate_model_activations(Unwrapped(), x, random_seed=0, verbose=True)
    assert "did not exist before the pass" in capsys.readouterr().out


def test_untraced_tensor_returned_by_a_module_or_the_model():
    class Inner(nn.Module):
        def forward(self, x):
            return torch._C._VariableFunctions.sin(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x), torch._C._VariableFunctions.cos(x)

    h = tl.log_forward_pass(Outer(), torch.randn(3), random_seed=0)
    first, second = h.untraced_layers
    # the gap is the module's output itself: no pass-through node after it
    assert h["inner"].label == first and h["inner"].parent_layers == [] and h["output.0"].parent_layers == [first]
    assert h["output.1"].parent_layers == [second]


GLOBAL_TABLE = torch.tensor([1.0, 2.0, 3.0])
DEFAULT_SHIFT = torch.tensor(0.125)


@dataclasses.dataclass
class Settings:
    weights: list


def shifted(x, shift=DEFAULT_SHIFT * 2):  # a default made when the function was defined
    return x + shift


class Constants(nn.Module):
    """Tensors made before the pass, reached every way a model can reach one."""

    class_table = torch.tensor([3.0, 2.0, 1.0])  # a class attribute

    def __init__(self):
        super().__init__()
        self.table = torch.tensor([0.5, 1.0, 2.0])
        self.tables = [torch.ones(3), {"shift": torch.full((3,), 0.25)}]
        self.register_buffer("offset", torch.zeros(3))
        self.cache = None
        self.cfg = SimpleNamespace(scale=torch.tensor(2.0))  # a plain object's attribute
        factor = torch.tensor(1.5)
        self.times = lambda y: y * factor  # a closure cell
        self.settings = Settings([{"gain": torch.tensor(0.75)}])  # inside a container of an object
        self.history = torch.ones(3, requires_grad=True) * 2  # with a grad_fn made before the pass

    def forward(self, x, bias=torch.tensor(0.5)):  # a default argument
        if self.cache is None:
            self.cache = x.detach() * 0
        y = x * self.table * self.tables[0] + self.tables[1]["shift"] + GLOBAL_TABLE + self.offset
        y = self.times(y * self.cfg.scale) + bias
        y = shifted(y * self.class_table) * self.settings.weights[0]["gain"]
        return y + self.cache + self.history


def test_tensors_that_existed_before_the_pass_are_not_gaps():
    """Constants are no gap, wherever the model holds them: module attributes (also in lists and
    dicts), globals of the model's file, parameters, buffers, a tensor the model cached during an
    earlier call, plain objects' attributes, closure cells, default arguments, class attributes,
    containers inside objects, and a tensor with a grad_fn of its own from before the pass."""
    model, x = Constants(), torch.randn(3)
    model(x)  # fills the cache before the pass
    h = log_checked(model, x)
    assert h.untraced_layers == []
    # one chain of the 13 operations from the input: each constant is an argument, not a node
    ops = [e for e in h if e.kind == "op"]
    assert [e.layer_type for e in ops] == ["mul"] * 2 + ["add"] * 3 + ["mul"] * 2 + ["add", "mul", "add", "mul"] + [
        "add"
    ] * 2
    assert [e.parent_layers[0] for e in ops] == ["input_1_0"] + [e.label for e in ops[:-1]]
    assert h[ops[4].parent_layers[1]].kind == "buffer" and all(len(e.parent_layers) == 1 for e in ops[5:])
    assert tl.validate_model_activations(model, x, random_seed=0)


class StashesUntraced(nn.Module):
    """Stores tensors an untraced call made during the pass in places that hold constants: they
    were made during the pass, so they are still gaps."""

    def __init__(self):
        super().__init__()
        self.cfg = SimpleNamespace(scale=None)
        cell = [None]
        self.stash, self.stashed = (lambda t: cell.__setitem__(0, t)), (lambda: cell[0])

    def forward(self, x):
        self.cfg.scale = torch._C._VariableFunctions.exp(x)
        self.stash(torch._C._VariableFunctions.sin(x))
        return x * self.cfg.scale + self.stashed()


@pytest.mark.parametrize("grad", [True, False])
def test_tensors_made_during_the_pass_by_untraced_calls_are_still_gaps(grad):
    x = torch.randn(3, requires_grad=grad)
    h = tl.log_forward_pass(StashesUntraced(), x, random_seed=0)
    first, second = h.untraced_layers
    assert h["mul_1"].parent_layers == ["input_1_0", first] and second in h["add_1"].parent_layers
    if grad:
        assert "ExpBackward0" in h[first].untraced_reason and "SinBackward0" in h[second].untraced_reason
    else:
        assert "did not exist before the pass" in h[first].untraced_reason
    assert not tl.validate_model_activations(StashesUntraced(), x, random_seed=0)


class KeepsUntracedOnItself(nn.Module):
    """Holds a constant, and stores a tensor an untraced call made during the pass as a module
    attribute before using either: where constants live is looked at only then, mid-pass."""

    def __init__(self):
        super().__init__()
        self.offset = torch.ones(3)

    def forward(self, x):
        self.scale = torch._C._VariableFunctions.exp(x)
        return x * self.scale + self.offset


def test_constants_are_looked_for_only_when_a_tensor_has_no_record(monkeypatch):
    """A pass whose every tensor has a record never scans the model's attributes and globals;
    the first tensor without one makes it look, once, and what it finds there that the pass
    itself made (untraced) is still a gap, not a constant."""
    from torchlens.trace.capture import run

    looks = []
    real = run.held_constants
    monkeypatch.setattr(run, "held_constants", lambda *a: looks.append(1) or real(*a))
    tl.log_forward_pass(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), torch.randn(2, 3), layers_to_save=None)
    assert looks == []
    model, x = KeepsUntracedOnItself(), torch.randn(3)
    model(x)  # the attribute exists from an earlier call too: the pass's own value is new
    h = tl.log_forward_pass(model, x, random_seed=0)
    assert looks == [1]
    (gap,) = h.untraced_layers
    assert h["mul_1"].parent_layers == ["input_1_0", gap]
    assert h["add_1"].parent_layers == [h["mul_1"].label]  # self.offset: a constant, no node


def test_the_pass_leaves_the_garbage_collector_as_it_was():
    """A pass tells old tensors from new ones by the collector's youngest generation: it never
    freezes, disables or collects, and its marker and callback are gone after a pass, also
    after a model that raised."""

    class Raises(nn.Module):
        def forward(self, x):
            raise ValueError("the model's own error")

    callbacks, enabled, thresholds = list(gc.callbacks), gc.isenabled(), gc.get_threshold()
    tl.log_forward_pass(Constants(), torch.randn(3))
    with pytest.raises(ValueError):
        tl.log_forward_pass(Raises(), torch.randn(3))
    assert gc.get_freeze_count() == 0 and gc.callbacks == callbacks
    assert (gc.isenabled(), gc.get_threshold()) == (enabled, thresholds)
    gc.disable()  # a process that turned automatic collection off keeps it off
    try:
        tl.log_forward_pass(Constants(), torch.randn(3))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_process_that_froze_objects_itself():
    """The pass must not undo a process's own ``gc.freeze()`` (a server before forking), and
    tells old from new tensors all the same."""
    model, x = Constants(), torch.randn(3)
    model(x)
    sentinel = []
    gc.freeze()
    try:
        made_after_freeze = torch.tensor(4.0)  # old for the pass, though not frozen
        model.late = SimpleNamespace(t=made_after_freeze)
        model.times = lambda y, late=model.late: y * late.t
        # (no ground truth here: the collector lists no frozen object, so trace_holes cannot)
        assert tl.log_forward_pass(model, x).untraced_layers == []
        assert tl.validate_model_activations(model, x, random_seed=0)
        assert len(tl.log_forward_pass(StashesUntraced(), x).untraced_layers) == 2
        assert not any(o is sentinel for o in gc.get_objects())  # still frozen
    finally:
        gc.unfreeze()


class CollectsMidPass(nn.Module):
    """Collections run inside the forward, between making tensors and using them: a tensor made
    by an untraced call is still a gap after a collection has moved it on, and a constant made
    before the pass is still a constant, whatever generation each ends up in."""

    def __init__(self):
        super().__init__()
        self.cfg = SimpleNamespace(offset=torch.tensor(2.0))

    def forward(self, x):
        made = torch._C._VariableFunctions.exp(x)
        gc.collect(0)
        y = x * made
        made_too = torch._C._VariableFunctions.sin(x)
        gc.collect()
        return y + made_too + self.cfg.offset


def test_collections_during_the_pass_move_nothing_across_the_line():
    h = tl.log_forward_pass(CollectsMidPass(), torch.randn(3))
    assert len(h.untraced_layers) == 2
    assert not any("offset" in label for label in h.untraced_layers)


def test_the_pass_walks_no_object_older_than_itself(monkeypatch):
    """Heap independence: a process that froze its objects and then grew by many more gets the
    same history, and the pass never asks the collector for anything but its youngest
    generation (the cost of a walk over the heap grows with the process, not the model)."""
    model, x = CollectsMidPass(), torch.randn(3)
    small = tl.log_forward_pass(model, x, random_seed=0)
    asked = []
    real = gc.get_objects

    def get_objects(generation=None):
        asked.append(generation)
        return real() if generation is None else real(generation)

    gc.freeze()
    ballast = [[i] for i in range(200_000)]  # old, unfrozen objects the walk would have listed
    try:
        monkeypatch.setattr(gc, "get_objects", get_objects)
        big = tl.log_forward_pass(model, x, random_seed=0)
    finally:
        monkeypatch.undo()
        gc.unfreeze()
    del ballast
    assert big.layer_labels == small.layer_labels and big.untraced_layers == small.untraced_layers
    assert asked and set(asked) == {0}


def test_ground_truth_looks_inside_objects():
    """``trace_holes`` finds argument tensors where torchlens looks for inputs: inside
    dataclasses, named tuples and plain objects too, bounded, never inside modules or records."""
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    holder = SimpleNamespace(inner=Settings([{"t": a}]), pair=torch.return_types.max((b, c)))
    holder.itself = holder  # a cycle is walked once
    found = tensors_in_arguments((holder, [ParentRef("x"), nn.Linear(1, 1)]), {"d": d})
    assert [t.item() for t in found] == [0.0, 1.0, 2.0, 3.0]
    deep = d
    for _ in range(10):
        deep = SimpleNamespace(child=deep)
    assert tensors_in_arguments(deep) == []  # past the depth limit


# ----- tensors made by calling a tensor class ----------------------------------------------------
class LegacyConstructors(nn.Module):
    """Every way a forward can build a tensor from data: the classes (legacy constructors), the
    factory functions and the ``new_tensor`` method."""

    def forward(self, x):
        assert isinstance(x, torch.FloatTensor) and not isinstance(x, torch.LongTensor)  # still classes
        a = torch.Tensor([[1.0, 2.0, 3.0]])
        b = torch.FloatTensor([[1, 2, 3]])
        c = torch.LongTensor([[1, 2, 3]]).float()
        d = x.new_tensor([[1.0, 2.0, 3.0]])
        e = torch.as_tensor([[1.0, 2.0, 3.0]])
        f = torch.asarray([[1.0, 2.0, 3.0]])
        g = torch.Tensor(2, 3).fill_(0.5)  # sizes: uninitialised memory, then filled
        return x + a + b + c + d + e + f + g


def test_tensor_classes_called_in_forward_are_logged_creations():
    x = torch.randn(2, 3)
    h = log_checked(LegacyConstructors(), x)
    assert h.untraced_layers == []
    by_function = {}
    for e in h:
        by_function.setdefault(e.func_name, []).append(e)
    for name in ("Tensor", "FloatTensor", "LongTensor", "as_tensor", "asarray"):
        for e in by_function[name]:
            assert e.kind == "op" and e.parent_layers == [], (name, e.parent_layers)  # a creation, like torch.zeros
    data, sizes = by_function["Tensor"]
    torch.testing.assert_close(data.activation, torch.tensor([[1.0, 2.0, 3.0]]))
    assert sizes.func_args == (2, 3) and sizes.child_layers == [by_function["fill_"][0].label]
    assert by_function["LongTensor"][0].activation.dtype == torch.int64
    assert tl.validate_model_activations(LegacyConstructors(), x, random_seed=0, verbose=True)


def test_calling_tensor_classes_during_a_pass_changes_nothing_else():
    """Other classes of the same metaclasses (nn.Parameter, tensor subclasses) are built as usual
    and not logged; a constructor's own error reaches the model; afterwards the metaclasses are
    exactly as before."""
    from torchlens.trace.capture.constructors import METACLASSES, call_slot

    before = [(dict(vars(meta)), call_slot(meta)) for meta in METACLASSES]

    class Subclass(torch.Tensor):
        pass

    class Builds(nn.Module):
        def forward(self, x):
            p = nn.Parameter(torch.ones(3))
            s = torch.ones(3).as_subclass(Subclass)
            with pytest.raises(TypeError, match="new"):
                torch.FloatTensor("not data")
            return x * p + s.sum()

    h = tl.log_forward_pass(Builds(), torch.ones(3), random_seed=0)
    assert not any(e.func_name in ("Parameter", "Subclass", "FloatTensor") for e in h)
    assert [(dict(vars(meta)), call_slot(meta)) for meta in METACLASSES] == before
    assert isinstance(torch.FloatTensor([1.0]), torch.FloatTensor)


def test_tensor_class_creations_replay_after_saving_and_loading(tmp_path):
    from torchlens.trace.validate import validate_history

    h = tl.log_forward_pass(LegacyConstructors(), torch.randn(2, 3), random_seed=0, save_function_args=True)
    loaded = tl.load(h.save(tmp_path / "h"))
    made = [e for e in loaded if e.func_name in ("Tensor", "FloatTensor", "LongTensor")]
    assert len(made) == 4 and all(callable(e.func) and e.func.__name__.startswith("torch_") for e in made)
    assert validate_history(loaded, verbose=True)


class _WritesAParameterViewWithoutGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight[:, 0].mul_(2)  # a view made under no_grad, written in place
        return self.lin(x)


def test_a_view_written_in_place_under_no_grad_is_traced():
    """Reading grad_fn of such a view raises in torch; the tracer used to fail on it."""
    torch.manual_seed(0)
    model, x = _WritesAParameterViewWithoutGrad(), torch.ones(1, 3)
    h = tl.log_forward_pass(model, x)
    torch.manual_seed(0)
    expected = _WritesAParameterViewWithoutGrad()(x)
    assert [e.layer_type for e in h] == ["input", "linear", "output"]
    assert torch.allclose(h["output"].activation, expected)


def test_old_and_new_tensors_where_the_collector_keeps_no_generations(monkeypatch):
    """A free-threaded build files no objects by age: the pass notes the tensors alive at its start
    instead, and tells constants from gaps the same way."""
    from torchlens.trace.capture import preexisting

    monkeypatch.setattr(preexisting, "_KEPT", False)
    before = torch.zeros(1)
    start = preexisting.PassStart()
    during = torch.zeros(1)
    try:
        assert start.existed(before) and not start.existed(during)
        assert start.existing([during, before]) == [before]
    finally:
        start.end()
    model, x = KeepsUntracedOnItself(), torch.randn(3)
    h = tl.log_forward_pass(model, x, random_seed=0)
    (gap,) = h.untraced_layers
    assert h["add_1"].parent_layers == [h["mul_1"].label]
