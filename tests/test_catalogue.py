"""Tests over the model catalogue in ``tests/models.py``.

* ``test_generic``: every model of the registry, logged with a fixed seed, must give the same outputs
  as a plain, identically seeded forward pass, leave the model in the same state, have a
  consistent graph and labels, and leave torch exactly as it found it.
* One or more specific tests per tricky model, checking saved activations against values
  recomputed by hand and the metadata a user relies on.
* Regression tests for bugs found while writing the catalogue are at the end.
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
import re

import models
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from models import REGISTRY, REGISTRY_BY_NAME
from torch import nn
from trace_holes import holes, tensors_alive

import torchlens as tl

SEED = 1234
LABEL_RE = re.compile(r"^([a-z0-9]+)_(\d+)_(\d+)(?::(\d+))?$")


# ----- helpers ---------------------------------------------------------------------------------
def seed_all(seed: int) -> None:
    """Seed exactly as ``log_forward_pass(random_seed=seed)`` does."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def log(name, **kwargs):
    """Build catalogue model ``name`` and its inputs, and log one pass with ``SEED``."""
    make_model, make_inputs = REGISTRY_BY_NAME[name]
    model = make_model()
    args, kw = make_inputs()
    kwargs.setdefault("random_seed", SEED)
    history = tl.log_forward_pass(model, list(args), kw or None, **kwargs)
    return history, model, args, kw


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, expected, **kw)


def exact(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def flatten_output(value, address="output"):
    """(address, tensor) for every tensor in a model's output, as torchlens names outputs."""
    if isinstance(value, torch.Tensor):
        return [(address, value)]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        return []
    found = []
    for key, item in items:
        found.extend(flatten_output(item, f"{address}.{key}"))
    return found


_TENSOR_ATTRS = (
    "__add__",
    "__radd__",
    "__iadd__",
    "__mul__",
    "__matmul__",
    "__getitem__",
    "__setitem__",
    "relu",
    "relu_",
    "add_",
    "mul_",
    "view",
    "reshape",
    "T",
    "mT",
    "real",
    "data",
    "contiguous",
    "masked_fill",
    "__bool__",
)


def torch_snapshot():
    """The objects torchlens patches during a pass (by identity)."""
    snap = {
        "torch.relu": torch.relu,
        "torch.cat": torch.cat,
        "torch.triu": torch.triu,
        "torch.from_numpy": torch.from_numpy,
        "torch.tensor": torch.tensor,
        "torch.rand": torch.rand,
        "torch.lstm": torch.lstm,
        "torch._VF.lstm": torch._VF.lstm,
        "torch._VF.dropout": torch._VF.dropout,
        "torch._VF.vf": torch._VF.vf,
        "F.relu": F.relu,
        "F.linear": F.linear,
        "F.gelu": F.gelu,
        "F.layer_norm": F.layer_norm,
        "F.multi_head_attention_forward": F.multi_head_attention_forward,
        "torch._C._nn.linear": torch._C._nn.linear,
        "models.triu": models.triu,
        "models.gelu": models.gelu,
        "torch._weight_norm": torch._weight_norm,
        "torch.sparse.mm": torch.sparse.mm,
        "torch.nested.to_padded_tensor": torch.nested.to_padded_tensor,
        "OpOverload.__call__": vars(torch._ops.OpOverload)["__call__"],
        "OpOverloadPacket.__call__": vars(torch._ops.OpOverloadPacket)["__call__"],
        "vmap_impl": vars(torch._functorch.apis)["vmap_impl"],
        "grad_impl": vars(torch._functorch.eager_transforms)["grad_impl"],
    }
    for name in _TENSOR_ATTRS:
        snap[f"Tensor.{name}"] = getattr(torch.Tensor, name)
        snap[f"Tensor.{name} own"] = name in vars(torch.Tensor)
    hooks = nn.modules.module
    snap["global hooks"] = (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks))
    return snap


def assert_torch_restored(before):
    after = torch_snapshot()
    for key, value in before.items():
        if isinstance(value, (bool, tuple)):
            assert after[key] == value, key
        else:
            assert after[key] is value, f"{key} was not restored"
    assert type(torch.relu).__name__ == "builtin_function_or_method"
    assert torch.relu(torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]


TORCH_AT_IMPORT = torch_snapshot()


def assert_consistent_graph(h):
    labels = h.layer_labels
    assert len(set(labels)) == len(labels), "labels are not unique"
    assert len(h) == len(labels) > 0
    seen_layers, type_counts = [], {}
    for i, e in enumerate(h):
        # label syntax and its parts
        m = LABEL_RE.match(e.label)
        assert m, f"bad label {e.label!r}"
        layer_type, k, n, pass_text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        assert layer_type == e.layer_type
        assert e.layer_label == f"{layer_type}_{k}_{n}"
        assert e.short_label == f"{layer_type}_{k}"
        if e.num_passes > 1:
            assert pass_text is not None and int(pass_text) == e.pass_num
            assert 1 <= e.pass_num <= e.num_passes
        else:
            assert pass_text is None and e.pass_num == 1
        if e.layer_label not in seen_layers:
            # n counts layers in order of their first pass; k counts layers of the type
            assert n == len(seen_layers), (e.label, seen_layers)
            type_counts[layer_type] = type_counts.get(layer_type, 0) + 1
            assert k == type_counts[layer_type], e.label
            seen_layers.append(e.layer_label)
        # lookup
        assert h[e.label] is e
        assert h[i] is e and h[i - len(h)] is e
        assert e.label in e.lookup_keys
        # parents and children agree
        assert set(e.parent_arg_positions) == set(e.parent_layers)
        assert len(set(e.parent_layers)) == len(e.parent_layers)
        assert len(set(e.child_layers)) == len(e.child_layers)
        for p in e.parent_layers:
            assert p in h, f"{e.label}: parent {p} missing"
            assert e.label in h[p].child_layers, f"{p} does not list {e.label} as a child"
            assert labels.index(p) < i, "parents come before children"
        for c in e.child_layers:
            assert c in h, f"{e.label}: child {c} missing"
            assert e.label in h[c].parent_layers, f"{c} does not list {e.label} as a parent"
        # kinds
        assert not e.is_untraced, f"{e.label}: {e.untraced_reason}"
        if e.is_input or e.is_buffer:
            assert e.parent_layers == [] and e.address
            assert not e.created_inside_model
        elif e.is_output:
            assert len(e.parent_layers) == 1 and e.child_layers == []
            assert e.address == "output" or e.address.startswith("output.")
        elif not e.created_inside_model:
            assert e.parent_layers, f"{e.label} depends on an input but has no parent"
        # saved activations
        assert e.activation is not None, e.label
        assert e.activation.shape == e.shape and e.activation.dtype == e.dtype
        assert e.nbytes == e.activation.nelement() * e.activation.element_size()
        assert e.label in str(e)
    assert h.input_layers == labels[: len(h.input_layers)]
    assert h.output_layers == labels[len(labels) - len(h.output_layers) :]
    assert str(h).startswith(f"Log of {h.model_name} forward pass:")  # the module table prints
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        h.print_layers()
    for label in labels:
        assert label in listing.getvalue()
    frame = h.to_pandas()
    assert list(frame["label"]) == labels


def test_consistency_checks_can_fail():
    """The generic checks are not tautologies: a broken graph or label is caught."""
    h, _, _, _ = log("branch_merge")
    assert_consistent_graph(h)
    h["input_1_0"].child_layers.remove("linear_2_3")
    with pytest.raises(AssertionError, match="input_1_0 does not list linear_2_3"):
        assert_consistent_graph(h)
    h, _, _, _ = log("branch_merge")
    h["tanh_1_2"].label = "tanh_2_2"
    with pytest.raises(AssertionError):
        assert_consistent_graph(h)


# ----- the generic test over the whole registry ------------------------------------------------
@pytest.mark.parametrize("name", [name for name, _, _ in REGISTRY])
def test_generic(name):
    make_model, make_inputs = REGISTRY_BY_NAME[name]
    model = make_model()
    reference = copy.deepcopy(model)
    training_before = [m.training for m in model.modules()]
    args, kwargs = make_inputs()
    assert_torch_restored(TORCH_AT_IMPORT)
    expected_error = getattr(type(model), "expected_error", None)
    if expected_error is not None:
        with pytest.raises(expected_error) as info:
            tl.log_forward_pass(model, list(args), kwargs or None, random_seed=SEED)
        notes = getattr(info.value, "__notes__", [])
        assert any("torchlens" in n and type(model).__name__ in n for n in notes), notes
        assert_torch_restored(TORCH_AT_IMPORT)
        assert [m.training for m in model.modules()] == training_before
        return

    h = tl.log_forward_pass(model, list(args), kwargs or None, random_seed=SEED)
    assert_torch_restored(TORCH_AT_IMPORT)
    assert h.random_seed == SEED
    assert [m.training for m in model.modules()] == training_before

    ref_args, ref_kwargs = make_inputs()
    seed_all(SEED)
    expected = flatten_output(reference(*ref_args, **ref_kwargs))
    assert expected, "every catalogue model returns at least one tensor"
    assert [h[address].label for address, _ in expected] == h.output_layers
    for address, tensor in expected:
        entry = h[address]
        assert entry.is_output and entry.address == address
        exact(entry.activation, tensor)
        exact(h[entry.parent_layers[0]].activation, tensor)

    # the model's state changed exactly as one plain forward pass changes it
    state, ref_state = model.state_dict(), reference.state_dict()
    assert state.keys() == ref_state.keys()
    for key in state:
        exact(state[key], ref_state[key])

    assert_consistent_graph(h)


@pytest.fixture(scope="module")
def built_catalogue():
    """Every catalogue model and its inputs, then one snapshot of the tensors alive (so the
    garbage collector is asked once, not once per model)."""
    built = {}
    for name, make_model, make_inputs in REGISTRY:
        model = make_model()
        if getattr(type(model), "expected_error", None) is None:
            built[name] = (model, *make_inputs())
    return built, tensors_alive()


@pytest.mark.parametrize(
    "name", [name for name, make_model, _ in REGISTRY if getattr(make_model(), "expected_error", None) is None]
)
def test_no_holes(name, built_catalogue):
    """Every tensor that enters a logged operation was logged or existed before the pass: no
    operation lost the parent it was computed from, and no untraced producer was needed."""
    built, alive_before = built_catalogue
    model, args, kwargs = built[name]
    h = tl.log_forward_pass(model, list(args), kwargs or None, random_seed=SEED, save_function_args=True)
    assert holes(h, alive_before) == []


# ----- plain structure -------------------------------------------------------------------------
def test_simple_feedforward():
    h, m, (x,), _ = log("simple_feedforward")
    assert h.layer_labels == ["input_1_0", "linear_1_1", "relu_1_2", "linear_2_3", "output_1_4"]
    lin1 = x @ m.fc1.weight.detach().T + m.fc1.bias.detach()
    close(h["linear_1_1"].activation, lin1)
    close(h["relu_1_2"].activation, lin1.clamp(min=0))
    close(h["output_1_4"].activation, lin1.clamp(min=0) @ m.fc2.weight.detach().T + m.fc2.bias.detach())
    exact(h["input_1_0"].activation, x)

    relu = h["relu_1_2"]
    assert relu.parent_layers == ["linear_1_1"] and relu.child_layers == ["linear_2_3"]
    assert relu.parent_arg_positions == {"linear_1_1": [0]}
    assert relu.containing_module == "act" and relu.modules_output_of == ["act:1"]
    assert relu.func is torch.relu and relu.func_name == "relu" and relu.grad_fn_name == "ReluBackward0"

    lin = h["linear_1_1"]
    assert lin.param_addresses == ("fc1.weight", "fc1.bias")
    assert [tuple(s) for s in lin.param_shapes] == [(4, 5), (4,)]
    assert lin.num_params == 24 and lin.param_bytes == 96
    assert lin.func is F.linear and lin.func_name == "linear"
    assert lin.layer_type == "linear" and lin.type_index == 1 and lin.layer_index == 1

    # every key form
    assert h["fc1"] is lin and h["fc1:1"] is lin and h["linear_1"] is lin and h["linear_1_1:1"] is lin
    assert h["act"] is relu and h[2] is relu and h[-3] is relu
    assert h["input.x"] is h["input_1_0"] and h["output"] is h["output_1_4"]
    assert h.input_layers == ["input_1_0"] and h.output_layers == ["output_1_4"]
    assert h.module_addresses == ["fc1", "act", "fc2"]
    assert h.module_types == {"fc1": "Linear", "act": "ReLU", "fc2": "Linear"}
    assert h.module_passes == {"fc1": 1, "act": 1, "fc2": 1}
    assert not h.is_branching and not h.is_recurrent and h.max_passes == 1
    assert h.buffer_layers == [] and h.internally_created_layers == []

    # where each operation was called from
    stack = lin.func_call_stack
    assert stack[0].file == models.__file__ and stack[0].function == "forward"
    assert stack[0].code_line == "return self.fc2(self.act(self.fc1(x)))"
    assert "F.linear(" in stack[-1].code_line

    with pytest.raises(KeyError, match="relu_1_2"):
        h["relu_1_9"]


def test_branch_merge():
    h, m, (x,), _ = log("branch_merge")
    add = h["add_1_5"]
    assert add.parent_layers == ["tanh_1_2", "sigmoid_1_4"]
    assert add.parent_arg_positions == {"tanh_1_2": [0], "sigmoid_1_4": [1]}
    assert h["input_1_0"].child_layers == ["linear_1_1", "linear_2_3"]
    assert h.is_branching
    with torch.no_grad():
        close(add.activation, torch.tanh(m.left(x)) + torch.sigmoid(m.right(x)))
    assert h["tanh_1_2"].containing_module is None and h["tanh_1_2"].modules_output_of == []
    assert h["right"].label == "linear_2_3"


def test_same_tensor_twice():
    h, _, (x,), _ = log("same_tensor_twice")
    assert h.layer_labels == ["input_1_0", "mul_1_1", "add_1_2", "output_1_3"]
    assert h["add_1_2"].parent_layers == ["mul_1_1"]
    assert h["add_1_2"].parent_arg_positions == {"mul_1_1": [0, 1]}
    assert h["mul_1_1"].child_layers == ["add_1_2"]
    close(h["add_1_2"].activation, 6 * x)


def test_square_via_mul():
    h, _, (x,), _ = log("square_via_mul")
    a, b = h["mul_1_1"], h["mul_2_2"]
    assert (a.func_name, b.func_name) == ("__mul__", "mul")
    assert a.layer_type == b.layer_type == "mul"
    assert b.func is torch.mul
    assert a.parent_arg_positions == b.parent_arg_positions == {"input_1_0": [0, 1]}
    assert h["input_1_0"].child_layers == ["mul_1_1", "mul_2_2", "add_1_4"]
    close(a.activation, x * x)
    close(b.activation, x * x)
    assert h["add_1_4"].parent_arg_positions == {"sub_1_3": [0], "input_1_0": [1]}


def test_two_ops_one_tensor():
    h, _, (x,), _ = log("two_ops_one_tensor")
    assert h["input_1_0"].child_layers == ["sin_1_1", "cos_1_2"]
    assert h["mul_1_3"].parent_arg_positions == {"sin_1_1": [0], "cos_1_2": [1]}
    close(h["sin_1_1"].activation, torch.sin(x))
    close(h["mul_1_3"].activation, torch.sin(x) * torch.cos(x))


# ----- inputs ------------------------------------------------------------------------------------
def test_multi_input():
    h, m, (x, y, z), _ = log("multi_input")
    assert h.input_layers == ["input_1_0", "input_2_1", "input_3_2"]
    assert [h[label].address for label in h.input_layers] == ["input.x", "input.y", "input.z"]
    assert h["input.y"].label == "input_2_1"
    exact(h["input.z"].activation, z)
    assert h["mul_1_4"].parent_arg_positions == {"linear_1_3": [0], "input_2_1": [1]}
    assert h["sub_1_5"].parent_arg_positions == {"mul_1_4": [0], "input_3_2": [1]}
    with torch.no_grad():
        close(h["output"].activation, m.fc(x) * y - z)


def test_nested_list_input():
    h, _, ((a, (b, c)),), _ = log("nested_list_input")
    assert [h[label].address for label in h.input_layers] == ["input.pair.0", "input.pair.1.0", "input.pair.1.1"]
    exact(h["input.pair.1.0"].activation, b)
    exact(h["input.pair.1.1"].activation, c)
    assert h["mul_1_3"].parent_layers == ["input_1_0", "input_2_1"]
    close(h["add_1_4"].activation, a * b + c)


def test_dict_input():
    h, m, (batch,), _ = log("dict_input")
    assert h["input.batch.feats"].label == "input_1_0"
    assert h["input.batch.bias"].label == "input_2_1"
    exact(h["input.batch.bias"].activation, batch["bias"])
    assert h["add_1_3"].parent_arg_positions == {"linear_1_2": [0], "input_2_1": [1]}
    with torch.no_grad():
        close(h["add_1_3"].activation, m.fc(batch["feats"]) + batch["bias"])


def test_keyword_mask():
    h, _, (x,), kw = log("keyword_mask")
    mask = kw["mask"]
    entry = h["input.mask"]
    assert entry.is_input and entry.label == "input_2_1"
    exact(entry.activation, mask)
    assert h["mul_1_3"].parent_arg_positions == {"exp_1_2": [0], "input_2_1": [1]}
    close(h["sum_1_4"].activation, (x.exp() * mask).sum(-1))
    # without the keyword argument there is no mask input and no multiplication
    h2 = tl.log_forward_pass(models.KeywordMask(), x)
    assert [e.layer_type for e in h2] == ["input", "exp", "sum", "output"]


def test_mixed_args():
    h, _, (x, scale, mode), _ = log("mixed_args")
    assert (scale, mode) == (0.25, "double")
    assert h.input_layers == ["input_1_0"]  # the float and the string are not layers
    assert [e.layer_type for e in h] == ["input", "mul", "mul", "add", "output"]
    close(h["mul_1_1"].activation, x * 2)
    close(h["add_1_3"].activation, x * 2 * 0.25 + 1.5)
    h2 = tl.log_forward_pass(models.MixedArgs(), [x, 3.0, "single"])
    assert [e.layer_type for e in h2] == ["input", "mul", "add", "output"]
    close(h2["output"].activation, x * 3.0 + 1.5)


# ----- outputs -----------------------------------------------------------------------------------
def test_tuple_output():
    h, _, (x,), _ = log("tuple_output")
    assert [h[label].address for label in h.output_layers] == ["output.0", "output.1", "output.2"]
    assert h["output.0"].parent_layers == ["add_1_1"]
    assert h["output.2"].parent_layers == ["sum_1_3"] and h["output.2"].shape == torch.Size([])
    close(h["output.1"].activation, x * 2)


def test_dict_output():
    h, m, (x,), _ = log("dict_output")
    assert h["output.logits"].parent_layers == ["linear_1_1"]
    assert h["output.probs"].parent_layers == ["softmax_1_2"]
    assert h["linear_1_1"].child_layers == ["softmax_1_2", "output_1_3"]
    with torch.no_grad():
        close(h["output.probs"].activation, m.fc(x).softmax(-1))


def test_nested_output():
    h, _, (x,), _ = log("nested_output")
    assert {h[label].address: h[label].parent_layers[0] for label in h.output_layers} == {
        "output.a": "neg_1_1",
        "output.b.0": "abs_1_2",
        "output.b.1.0": "exp_1_3",
    }
    close(h["output.b.1.0"].activation, x.exp())


def test_same_tensor_returned_twice():
    h, _, (x,), _ = log("same_tensor_returned_twice")
    assert h.output_layers == ["output_1_2", "output_2_3"]
    assert h["tanh_1_1"].child_layers == ["output_1_2", "output_2_3"]
    assert h["output.0"].parent_layers == h["output.1"].parent_layers == ["tanh_1_1"]
    close(h["output.1"].activation, x.tanh())


# ----- buffers -----------------------------------------------------------------------------------
def test_buffer_use():
    h, _, (x,), _ = log("buffer_use")
    assert h.buffer_layers == ["buffer_1_1"]
    buf = h["buffer_1_1"]
    assert buf.is_buffer and buf.address == "offset" and h["offset"] is buf
    assert buf.containing_module is None and not buf.created_inside_model
    exact(buf.activation, torch.arange(4.0))
    assert h["add_1_2"].parent_arg_positions == {"input_1_0": [0], "buffer_1_1": [1]}
    close(h["add_1_2"].activation, x + torch.arange(4.0))


def test_buffer_counter():
    model = models.BufferCounter()
    x = torch.ones(2, 3)
    h = tl.log_forward_pass(model, x)
    assert h.layer_labels == ["input_1_0", "buffer_1_1", "add_1_2", "mul_1_3", "output_1_4"]
    assert h["buffer_1_1"].address == "count"
    exact(h["buffer_1_1"].activation, torch.zeros(1))
    add = h["add_1_2"]
    assert add.stored_as_buffer == "count" and add.created_inside_model
    assert "Stored as buffer: count" in str(add)
    exact(add.activation, torch.ones(1))
    assert h["mul_1_3"].parent_arg_positions == {"input_1_0": [0], "add_1_2": [1]}
    exact(model.count, torch.ones(1))
    # the next pass starts from the stored value
    h2 = tl.log_forward_pass(model, x)
    exact(h2["buffer_1_1"].activation, torch.ones(1))
    exact(h2["output"].activation, torch.full((2, 3), 2.0))
    exact(model.count, torch.full((1,), 2.0))


def test_running_mean_inplace():
    h, model, (x,), _ = log("running_mean_inplace")
    init = torch.tensor([1.0, -2.0, 3.0])
    buf = h["buffer_1_1"]
    assert buf.address == "running_mean" and buf.is_buffer
    # (the value this buffer layer saves is checked in test_buffer_layer_saves_value_before_first_use)
    mul = h["mul_1_2"]
    assert mul.func_name == "mul_" and mul.is_inplace and mul.created_inside_model
    close(mul.activation, init * 0.9)
    add = h["add_1_5"]
    assert add.func_name == "add_" and add.is_inplace and not add.created_inside_model
    assert add.stored_as_buffer == "running_mean" and add.grad_fn_name is None
    assert add.parent_arg_positions == {"mul_1_2": [0], "mul_2_4": [1]}
    new_mean = init * 0.9 + 0.1 * x.mean(0)
    close(add.activation, new_mean)
    close(model.running_mean, new_mean)
    assert h["sub_1_6"].parent_arg_positions == {"input_1_0": [0], "add_1_5": [1]}
    close(h["output"].activation, x - new_mean)


def test_buffer_in_submodule():
    h, _, (x,), _ = log("buffer_in_submodule")
    buf = h["norm.scale"]
    assert buf.label == "buffer_1_1" and buf.is_buffer and buf.address == "norm.scale"
    assert buf.containing_module == "norm" and buf.containing_modules == ["norm:1"]
    assert h["mul_1_2"].modules_output_of == ["norm:1"] and h["norm"] is h["mul_1_2"]
    close(h["output"].activation, (x * 2).sum(-1))


def test_batchnorm_train():
    h, model, (x,), _ = log("batchnorm_train")
    assert h.buffer_layers == ["buffer_1_1", "buffer_2_2"]
    assert [h[b].address for b in h.buffer_layers] == ["bn.running_mean", "bn.running_var"]
    bn = h["batchnorm_1_3"]
    assert bn.param_addresses == ("bn.weight", "bn.bias") and bn.modules_output_of == ["bn:1"]
    assert bn.parent_arg_positions == {"input_1_0": [0], "buffer_1_1": [3], "buffer_2_2": [4]}
    mean, var = x.mean(0), x.var(0, unbiased=False)
    close(bn.activation, (x - mean) / torch.sqrt(var + 1e-5))
    close(model.bn.running_mean, 0.1 * mean)
    assert int(model.bn.num_batches_tracked) == 1


def test_batchnorm_eval():
    h, model, (x,), _ = log("batchnorm_eval")
    assert [h[b].address for b in h.buffer_layers] == ["bn.running_mean", "bn.running_var"]
    close(h["batchnorm_1_3"].activation, x / torch.sqrt(torch.tensor(1 + 1e-5)))
    exact(model.bn.running_mean, torch.zeros(3))
    assert int(model.bn.num_batches_tracked) == 0


# ----- in-place operations -----------------------------------------------------------------------
def test_inplace_relu_module():
    h, m, (x,), _ = log("inplace_relu_module")
    assert h.layer_labels == ["input_1_0", "linear_1_1", "relu_1_2", "mul_1_3", "output_1_4"]
    with torch.no_grad():
        lin = m.fc(x)
    assert (lin < 0).any()
    exact(h["linear_1_1"].activation, lin)  # the value before ReLU overwrote it
    relu = h["relu_1_2"]
    assert relu.parent_layers == ["linear_1_1"] and h["act"] is relu
    close(relu.activation, lin.clamp(min=0))
    close(h["output"].activation, lin.clamp(min=0) * 2)


def test_inplace_ops():
    h, _, (x, y), _ = log("inplace_ops")
    assert h.layer_labels == ["input_1_0", "input_2_1", "mul_1_2", "iadd_1_3", "relu_1_4", "add_1_5", "output_1_6"]
    assert [h[k].func_name for k in ("iadd_1_3", "relu_1_4", "add_1_5")] == ["__iadd__", "relu_", "add_"]
    assert [h[k].is_inplace for k in ("mul_1_2", "iadd_1_3", "relu_1_4", "add_1_5")] == [False, True, True, True]
    # each node keeps the value before the next in-place operation changed the tensor
    close(h["mul_1_2"].activation, x)
    close(h["iadd_1_3"].activation, x + y)
    close(h["relu_1_4"].activation, (x + y).clamp(min=0))
    close(h["add_1_5"].activation, (x + y).clamp(min=0) + 1)
    assert h["iadd_1_3"].parent_arg_positions == {"mul_1_2": [0], "input_2_1": [1]}
    assert h["relu_1_4"].parent_layers == ["iadd_1_3"] and h["add_1_5"].parent_layers == ["relu_1_4"]


def test_setitem():
    h, _, (x,), _ = log("setitem")
    first, second = h["setitem_1_2"], h["setitem_2_5"]
    assert first.func_name == "__setitem__" and first.is_inplace and second.is_inplace
    close(h["add_1_1"].activation, x + 1)  # not zeroed: the value before the write
    expected_first = x + 1
    expected_first[:, 0] = 0
    close(first.activation, expected_first)
    expected_second = expected_first.clone()
    expected_second[:, 1] = x[:, 2] * 10
    close(second.activation, expected_second)
    assert first.parent_arg_positions == {"add_1_1": [0]}
    assert second.parent_arg_positions == {"setitem_1_2": [0], "mul_1_4": [2]}
    assert h["getitem_1_3"].parent_layers == ["input_1_0"]


def test_slice_write_clone():
    h, _, (x,), _ = log("slice_write_clone")
    exact(h["clone_1_1"].activation, x)  # before the slice write
    close(h["getitem_1_2"].activation, x[:, :2])
    write = h["setitem_1_4"]
    assert write.is_inplace
    assert write.parent_arg_positions == {"clone_1_1": [0], "mul_1_3": [2]}
    expected = x.clone()
    expected[:, 1:3] = x[:, :2] * 2
    close(write.activation, expected)


def test_mutates_input():
    make_model, make_inputs = REGISTRY_BY_NAME["mutates_input"]
    (x,), _ = make_inputs()
    original = x.clone()
    h = tl.log_forward_pass(make_model(), x)
    exact(h["input.x"].activation, original)  # saved before the model doubled it
    mul = h["mul_1_1"]
    assert mul.is_inplace and mul.func_name == "mul_" and mul.parent_layers == ["input_1_0"]
    close(mul.activation, original * 2)
    close(h["output"].activation, original * 2 + 1)
    close(x, original * 2)  # the caller's tensor changed, as in a plain forward


# ----- tensors created in forward; pruning -------------------------------------------------------
def test_created_inside():
    h, _, (x,), _ = log("created_inside")
    assert h.internally_created_layers == [
        "rand_1_1",
        "ones_1_2",
        "arange_1_3",
        "fromnumpy_1_4",
        "tensor_1_5",
        "mul_1_6",
        "mul_2_9",
    ]
    # the unused torch.rand(7) was dropped; the used one is kept
    assert [e.label for e in h if e.layer_type == "rand"] == ["rand_1_1"]
    assert h["rand_1_1"].shape == torch.Size([2, 4]) and h["rand_1_1"].parent_layers == []
    seed_all(SEED)
    torch.rand(7)
    exact(h["rand_1_1"].activation, torch.rand(2, 4))
    exact(h["fromnumpy_1_4"].activation, torch.from_numpy(np.linspace(0.0, 1.0, 4, dtype=np.float32)))
    exact(h["tensor_1_5"].activation, torch.tensor(0.5))
    assert not h["input_1_0"].created_inside_model and not h["add_1_7"].created_inside_model
    assert h["add_1_7"].parent_arg_positions == {"input_1_0": [0], "mul_1_6": [1]}
    assert h["mul_2_9"].parent_layers == ["arange_1_3", "fromnumpy_1_4"]


def test_dead_end_is_kept():
    h, _, (x,), _ = log("dead_end")
    assert h.layer_labels == ["input_1_0", "exp_1_1", "sum_1_2", "linear_1_3", "output_1_4"]
    assert h["sum_1_2"].child_layers == [] and not h["sum_1_2"].is_output
    assert h["input_1_0"].child_layers == ["exp_1_1", "linear_1_3"]
    close(h["sum_1_2"].activation, x.exp().sum())


def test_python_numpy_random():
    h, _, (x,), _ = log("python_numpy_random")
    seed_all(SEED)
    noise = torch.from_numpy(np.random.rand(2, 3).astype(np.float32))
    factor = random.random()
    exact(h["fromnumpy_1_1"].activation, noise)
    assert h["fromnumpy_1_1"].created_inside_model
    close(h["output"].activation, x * factor + noise)
    other = tl.log_forward_pass(models.PythonNumpyRandom(), x, random_seed=SEED + 1)
    assert not torch.equal(other["output"].activation, h["output"].activation)


# ----- module reuse ------------------------------------------------------------------------------
def test_module_called_twice():
    h, m, (x,), _ = log("module_called_twice")
    assert h.layer_labels == ["input_1_0", "linear_1_1:1", "linear_1_1:2", "output_1_2"]
    first, second = h["fc:1"], h["fc:2"]
    assert (first.label, second.label) == ("linear_1_1:1", "linear_1_1:2")
    assert first.layer_label == second.layer_label == "linear_1_1"
    assert (first.pass_num, second.pass_num, first.num_passes) == (1, 2, 2)
    assert h["linear_1:2"] is second and h[2] is second
    assert second.parent_layers == ["linear_1_1:1"] and first.child_layers == ["linear_1_1:2"]
    assert first.modules_output_of == ["fc:1"] and second.modules_output_of == ["fc:2"]
    with torch.no_grad():
        close(first.activation, m.fc(x))
        close(second.activation, m.fc(m.fc(x)))
    assert h.module_passes == {"fc": 2}
    assert h.is_recurrent and h.max_passes == 2
    for key in ("fc", "linear_1_1", "linear_1"):
        with pytest.raises(KeyError) as info:
            h[key]
        assert "linear_1_1:1" in str(info.value) and "linear_1_1:2" in str(info.value)


def test_shared_linear_two_branches():
    h, m, (x, y), _ = log("shared_linear_two_branches")
    a, b = h["proj:1"], h["proj:2"]
    assert (a.label, b.label) == ("linear_1_2:1", "linear_1_2:2")
    assert a.parent_layers == ["input_1_0"] and b.parent_layers == ["input_2_1"]
    assert h["mul_1_3"].parent_arg_positions == {"linear_1_2:1": [0], "linear_1_2:2": [1]}
    with torch.no_grad():
        close(b.activation, m.proj(y))


def test_loop_weighted_passes():
    h, m, (x,), _ = log("loop_weighted")
    passes = [h[f"cell:{i}"] for i in (1, 2, 3)]
    assert [e.label for e in passes] == ["linear_1_1:1", "linear_1_1:2", "linear_1_1:3"]
    assert all(e.num_passes == 3 and e.param_addresses == ("cell.weight", "cell.bias") for e in passes)
    assert h.max_passes == 3 and h.is_recurrent and h.module_passes == {"cell": 3}
    value = x
    with torch.no_grad():
        for i, e in enumerate(passes):
            value = m.cell(value)
            close(e.activation, value)
            value = torch.tanh(value)
            (tanh_label,) = e.child_layers
            assert h[tanh_label].layer_type == "tanh"
            close(h[tanh_label].activation, value)
            if i < 2:
                assert h[tanh_label].child_layers == [passes[i + 1].label]
    assert passes[0].parent_layers == ["input_1_0"]


def test_tied_weights():
    h, m, (ids,), _ = log("tied_weights")
    emb, proj = h["embedding_1_1"], h["linear_1_3"]
    assert emb.param_addresses == proj.param_addresses == ("emb.weight",)
    assert emb.num_passes == proj.num_passes == 1  # different operations: separate layers
    assert emb.modules_output_of == ["emb:1"] and proj.containing_module is None
    weight = m.emb.weight.detach()
    close(emb.activation, weight[ids])
    # the logged function is the innermost one, torch.embedding(weight, indices)
    assert emb.parent_arg_positions == {"input_1_0": [1]}
    close(emb.func(weight, ids), emb.activation)
    close(proj.activation, torch.tanh(weight[ids]) @ weight.T)


def test_identity_module():
    h, _, (x,), _ = log("identity")
    ident = h["skip"]
    assert ident.label == "identity_1_2" and ident.layer_type == "identity"
    assert ident.parent_layers == ["linear_1_1"] and ident.child_layers == ["add_1_3"]
    assert ident.modules_output_of == ["skip:1"] and ident.param_addresses == ()
    exact(ident.activation, h["linear_1_1"].activation)


def test_relu_attribute():
    h, m, (x,), _ = log("relu_attribute")
    relu = h["relu_1_2"]
    assert relu.func is torch.relu and relu.parent_layers == ["linear_1_1"]
    with torch.no_grad():
        close(relu.activation, torch.relu(m.fc(x)))
    assert m.act is torch.relu and vars(m)["act"] is torch.relu


def test_file_level_import():
    h, _, (x,), _ = log("file_level_import")
    assert [e.layer_type for e in h] == ["input", "triu", "gelu", "output"]
    close(h["triu_1_1"].activation, torch.triu(x))
    close(h["gelu_1_2"].activation, F.gelu(torch.triu(x)))
    assert models.triu is torch.triu and models.gelu is F.gelu


# ----- properties --------------------------------------------------------------------------------
def test_tensor_properties():
    h, _, (x,), _ = log("tensor_properties")
    t = h["t_1_1"]
    assert t.func_name == "T" and t.parent_layers == ["input_1_0"]
    exact(t.activation, x.T)
    assert h["matmul_1_2"].parent_arg_positions == {"t_1_1": [0], "input_1_0": [1]}
    assert h["mt_1_3"].func_name == "mT"
    exact(h["mt_1_3"].activation, x.mT)
    assert h["complex_1_6"].dtype == torch.complex64
    real = h["real_1_7"]
    assert real.parent_layers == ["complex_1_6"] and real.dtype == torch.float32
    exact(real.activation, x)
    data = h["data_1_8"]
    assert data.parent_layers == ["input_1_0"] and data.grad_fn_name is None
    exact(data.activation, x)


def test_param_transpose():
    h, m, (x,), _ = log("param_transpose")
    t = h["t_1_1"]
    assert t.param_addresses == ("W",) and t.parent_layers == [] and t.created_inside_model
    exact(t.activation, m.W.detach().T)
    assert h["matmul_1_2"].parent_arg_positions == {"input_1_0": [0], "t_1_1": [1]}


def test_complex_ops():
    h, _, (x,), _ = log("complex_ops")
    z = torch.view_as_complex(x)
    assert h["viewascomplex_1_2"].dtype == torch.complex64
    assert h["mul_1_6"].parent_arg_positions == {"viewascomplex_1_2": [0, 1]}
    close(h["imag_1_7"].activation, (z * z).imag)
    close(h["output"].activation, z.abs() + z.angle() + (z * z).imag)


# ----- randomness --------------------------------------------------------------------------------
def test_dropout_is_reproducible_with_random_seed():
    make_model, make_inputs = REGISTRY_BY_NAME["dropout_train"]
    model = make_model()
    (x,), _ = make_inputs()
    state = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    h1 = tl.log_forward_pass(model, x, random_seed=7)
    # the caller's random state is untouched
    assert torch.equal(torch.get_rng_state(), state[0]) and random.getstate() == state[1]
    assert np.array_equal(np.random.get_state()[1], state[2])
    h2 = tl.log_forward_pass(model, x, random_seed=7)
    h3 = tl.log_forward_pass(model, x, random_seed=8)
    drop1 = h1["drop"].activation
    assert drop1.eq(0).any() and drop1.ne(0).any()
    exact(h2["drop"].activation, drop1)
    assert not torch.equal(h3["drop"].activation, drop1)
    with torch.no_grad():
        lin = model.fc(x)
    kept = drop1 != 0
    close(drop1[kept], lin[kept] * 2)
    # a pass without a seed records the one it chose, and that seed replays it
    h4 = tl.log_forward_pass(model, x)
    assert isinstance(h4.random_seed, int)
    seed_all(h4.random_seed)
    with torch.no_grad():
        exact(h4["output"].activation, model(x))


# ----- recurrent layers --------------------------------------------------------------------------
def test_lstm():
    h, m, (x,), _ = log("lstm")
    assert [e.label for e in h if e.layer_type == "lstm"] == ["lstm_1_3", "lstm_2_4", "lstm_3_5"]
    assert h.internally_created_layers == ["zeros_1_1", "zeros_2_2"]
    zeros = h["zeros_1_1"]
    assert zeros.containing_module == "lstm" and zeros.parent_layers == []
    exact(zeros.activation, torch.zeros(1, 2, 5))
    out, hc = h["lstm_1_3"], h["lstm_2_4"]
    assert out.parent_arg_positions == {"input_1_0": [0], "zeros_1_1": [(1, 0)], "zeros_2_2": [(1, 1)]}
    assert out.param_addresses == ("lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0")
    assert out.modules_output_of == hc.modules_output_of == ["lstm:1"]
    with torch.no_grad():
        ref_out, (ref_h, ref_c) = m.lstm(x)
    close(out.activation, ref_out)
    close(hc.activation, ref_h)
    close(h["lstm_3_5"].activation, ref_c)
    assert h.module_passes == {"lstm": 1}
    assert not {"sigmoid", "linear", "tanh"} & {e.layer_type for e in h}  # fused, not unrolled
    with pytest.raises(KeyError):
        h["lstm"]  # three output tensors


def test_gru():
    h, m, (x,), _ = log("gru")
    assert [e.label for e in h if e.layer_type == "gru"] == ["gru_1_2", "gru_2_3"]
    assert h.internally_created_layers == ["zeros_1_1"]
    assert h["gru_2_3"].child_layers == []  # the final state is unused, but kept
    with torch.no_grad():
        ref_out, ref_h = m.gru(x)
    close(h["gru_1_2"].activation, ref_out)
    close(h["gru_2_3"].activation, ref_h)
    assert h["head"].parent_layers == ["getitem_1_4"]


# ----- errors ------------------------------------------------------------------------------------
def test_raises_midway_note_and_restoration():
    make_model, make_inputs = REGISTRY_BY_NAME["raises_midway"]
    model = make_model()
    (x,), _ = make_inputs()
    model.eval()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        tl.log_forward_pass(model, x)
    (note,) = [n for n in info.value.__notes__ if "torchlens" in n]
    assert "RaisesMidway" in note and "'__matmul__'" in note
    assert f"{models.__file__}:" in note and "in forward()" in note
    assert_torch_restored(TORCH_AT_IMPORT)
    assert not model.training
    # the next pass works normally
    h = tl.log_forward_pass(models.SimpleFeedforward(), torch.ones(1, 5))
    assert h.layer_labels == ["input_1_0", "linear_1_1", "relu_1_2", "linear_2_3", "output_1_4"]


def test_raises_in_submodule_note():
    make_model, make_inputs = REGISTRY_BY_NAME["raises_in_submodule"]
    (x,), _ = make_inputs()
    with pytest.raises(ValueError, match="refusing this input") as info:
        tl.log_forward_pass(make_model(), x)
    (note,) = [n for n in info.value.__notes__ if "torchlens" in n]
    assert "ValueError inside module 'check'" in note and "raised at" in note
    assert_torch_restored(TORCH_AT_IMPORT)


# ----- module nesting ----------------------------------------------------------------------------
def test_nested_3_levels():
    h, m, (x,), _ = log("nested_3_levels")
    lin = h["linear_1_1"]
    assert lin.containing_modules == ["middle:1", "middle.leaf:1", "middle.leaf.fc:1"]
    assert lin.containing_module == "middle.leaf.fc" and lin.modules_output_of == ["middle.leaf.fc:1"]
    assert h["relu_1_2"].containing_modules == ["middle:1", "middle.leaf:1"]
    assert h["middle.leaf"] is h["relu_1_2"] and h["middle"] is h["mul_1_3"]
    assert h["middle.leaf.fc"] is lin
    assert h["add_1_4"].containing_module is None
    assert h.module_addresses == ["middle", "middle.leaf", "middle.leaf.fc"]
    assert h.module_types == {"middle": "Middle", "middle.leaf": "Leaf", "middle.leaf.fc": "Linear"}
    with torch.no_grad():
        close(h["output"].activation, torch.relu(m.middle.leaf.fc(x)) * 2 + 1)
    assert "middle.leaf.fc" in str(h)


def test_sequential_modulelist_loop():
    h, m, (x,), _ = log("sequential_modulelist_loop")
    tanh = h["tanh_1_2"]
    assert tanh.modules_output_of == ["stem.1:1", "stem:1"]  # innermost first
    assert tanh.containing_modules == ["stem:1", "stem.1:1"]
    assert h["stem"] is tanh and h["stem.1"] is tanh
    assert [h[f"blocks.{i}"].label for i in range(3)] == ["linear_2_3", "linear_3_5", "linear_4_7"]
    assert h["blocks.1"].param_addresses == ("blocks.1.weight", "blocks.1.bias")
    assert h["relu_2_6"].containing_module is None
    with torch.no_grad():
        v = m.stem(x)
        for block in m.blocks:
            v = torch.relu(block(v))
    close(h["output"].activation, v)


def test_functional_only():
    h, _, (x,), _ = log("functional_only")
    assert h.module_addresses == [] and h.module_passes == {}
    assert all(e.param_addresses == () and e.containing_module is None for e in h)
    assert {"softplus", "clamp", "log"} <= {e.layer_type for e in h}
    close(h["softplus_1_1"].activation, F.softplus(x))


def test_layer_norm_composites_log_once():
    h, m, (x,), _ = log("layer_norm")
    assert [e.layer_type for e in h] == ["input", "layernorm", "mul", "layernorm", "output"]
    assert h["layernorm_1_1"].param_addresses == ()
    assert h["layernorm_2_3"].param_addresses == ("ln.weight", "ln.bias") and h["ln"] is h["layernorm_2_3"]
    y = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    close(h["layernorm_1_1"].activation, y)
    with torch.no_grad():
        close(h["output"].activation, m.ln(y * 2))


def test_multihead_attention():
    h, m, (x,), _ = log("multihead_attention")
    assert all(e.containing_module == "attn" for e in h if not (e.is_input or e.is_output))
    assert not any("multi_head_attention" in e.func_name for e in h)
    in_proj = [e for e in h if e.param_addresses == ("attn.in_proj_weight", "attn.in_proj_bias")]
    out_proj = [e for e in h if e.param_addresses == ("attn.out_proj.weight", "attn.out_proj.bias")]
    assert len(in_proj) == 1 and len(out_proj) == 1  # q, k and v share one packed projection
    assert in_proj[0].layer_type == out_proj[0].layer_type == "linear"
    assert h.module_passes == {"attn": 1}
    weights = h["output.1"].activation
    close(weights.sum(-1), torch.ones(2, 5))
    with torch.no_grad():
        ref_out, ref_w = m.attn(x, x, x)
    close(h["output.0"].activation, ref_out)
    close(weights, ref_w)
    assert h[h["output.1"].parent_layers[0]].modules_output_of == ["attn:1"]


def test_conv_pool_flatten():
    h, m, (x,), _ = log("conv_pool_flatten")
    assert [e.layer_type for e in h] == ["input", "conv2d", "relu", "maxpool2d", "flatten", "linear", "output"]
    with torch.no_grad():
        conv = F.conv2d(x, m.conv.weight, m.conv.bias, padding=1)
    close(h["conv2d_1_1"].activation, conv)
    pooled = F.max_pool2d(conv.clamp(min=0), 2)
    assert h["pool"] is h["maxpool2d_1_3"]
    close(h["maxpool2d_1_3"].activation, pooled)
    assert h["flatten_1_4"].shape == torch.Size([2, 16])
    assert h["conv2d_1_1"].param_addresses == ("conv.weight", "conv.bias")


def test_matmul_einsum():
    h, _, (a, b), _ = log("matmul_einsum")
    names = [h[k].func_name for k in ("matmul_1_2", "matmul_2_3", "einsum_1_4", "bmm_1_5")]
    assert names == ["__matmul__", "matmul", "einsum", "bmm"]
    assert h["einsum_1_4"].parent_arg_positions == {"input_1_0": [1], "input_2_1": [2]}
    for k in ("matmul_1_2", "matmul_2_3", "einsum_1_4", "bmm_1_5"):
        close(h[k].activation, torch.bmm(a, b))
    assert h["input_2_1"].child_layers == ["matmul_1_2", "matmul_2_3", "einsum_1_4", "bmm_1_5"]


def test_cat_stack():
    h, _, (x, y), _ = log("cat_stack")
    cat = h["cat_1_4"]
    assert cat.parent_arg_positions == {"input_1_0": [(0, 0)], "mul_1_2": [(0, 1)], "exp_1_3": [(0, 2)]}
    close(cat.activation, torch.cat([x, y * 2, x.exp()], 1))
    stack = h["stack_1_5"]
    assert stack.parent_arg_positions == {"input_1_0": [(0, 0)], "input_2_1": [(0, 1)]}
    exact(stack.activation, torch.stack((x, y)))


def test_split_chunk():
    h, _, (x,), _ = log("split_chunk")
    splits = [e for e in h if e.layer_type == "splitwithsizes"]
    chunks = [e for e in h if e.layer_type == "chunk"]
    assert [e.label for e in splits] == ["splitwithsizes_1_1", "splitwithsizes_2_2"]
    assert [e.label for e in chunks] == ["chunk_1_3", "chunk_2_4", "chunk_3_5"]
    exact(splits[0].activation, x[:, :2])
    exact(splits[1].activation, x[:, 2:])
    for i, e in enumerate(chunks):
        exact(e.activation, x[:, 2 * i : 2 * i + 2])
        assert e.parent_layers == ["input_1_0"] and len(e.child_layers) == 1
    assert h["input_1_0"].child_layers == [e.label for e in splits + chunks]


def test_tensor_index_getitem():
    h, _, (x,), _ = log("tensor_index_getitem")
    idx = x[:, 0].argsort()
    assert h["argsort_1_2"].dtype == torch.int64
    exact(h["argsort_1_2"].activation, idx)
    get = h["getitem_2_3"]
    assert get.parent_arg_positions == {"input_1_0": [0], "argsort_1_2": [1]}
    exact(get.activation, x[idx])


def test_masked_fill():
    h, _, (x,), _ = log("masked_fill")
    mask = h["lt_1_1"]
    assert mask.dtype == torch.bool and mask.parent_layers == ["input_1_0"]
    exact(mask.activation, x < 0)
    fill = h["maskedfill_1_2"]
    assert fill.parent_arg_positions == {"input_1_0": [0], "lt_1_1": [1]}
    exact(fill.activation, torch.where(x < 0, torch.tensor(-1.0), x))


def test_where():
    h, _, (x,), _ = log("where")
    w = h["where_1_4"]
    assert w.parent_arg_positions == {"gt_1_1": [0], "sqrt_1_2": [1], "neg_1_3": [2]}
    close(w.activation, torch.where(x > 0.5, x.sqrt(), -x))


def test_view_reshape_permute():
    h, _, (x,), _ = log("view_reshape_permute")
    assert [e.layer_type for e in h][1:-1] == ["permute", "contiguous", "view", "reshape", "transpose", "flatten"]
    exact(h["permute_1_1"].activation, x.permute(0, 2, 1))
    assert h["view_1_3"].shape == torch.Size([2, 12])
    exact(h["output"].activation, x.permute(0, 2, 1).reshape(2, 4, 3).transpose(1, 2).flatten())


def test_residual_block():
    h, m, (x,), _ = log("residual_block")
    add = h["add_1_10"]
    assert add.parent_arg_positions == {"batchnorm_2_9": [0], "input_1_0": [1]}
    assert h["input_1_0"].child_layers == ["conv2d_1_1", "add_1_10"]
    assert h.is_branching
    assert h["conv2d_1_1"].param_addresses == ("conv1.weight",)
    assert [h[b].address for b in h.buffer_layers] == [
        "bn1.running_mean",
        "bn1.running_var",
        "bn2.running_mean",
        "bn2.running_var",
    ]
    with torch.no_grad():
        inner = m.bn2(m.conv2(F.relu(m.bn1(m.conv1(x)))))
    close(add.activation, inner + x)
    close(h["output"].activation, F.relu(inner + x))


def test_direct_parameter():
    h, m, (x,), _ = log("direct_parameter")
    mul, add = h["mul_1_1"], h["add_1_2"]
    assert mul.param_addresses == ("scale",) and mul.param_shapes == [torch.Size([3])]
    assert mul.num_params == 3 and mul.param_bytes == 12
    assert add.param_addresses == ("shift",) and add.parent_layers == ["mul_1_1"]
    assert mul.parent_arg_positions == {"input_1_0": [0]}  # parameters are not parent layers
    assert h.num_params == 4 and h.num_param_operations == 2
    close(add.activation, x * torch.tensor([1.0, 2.0, 3.0]) + 0.5)


def test_scalar_loss():
    h, m, (x, target), _ = log("scalar_loss")
    out = h["output"]
    assert out.shape == torch.Size([]) and h[out.parent_layers[0]].layer_type == "mseloss"
    assert h["input.target"].label == "input_2_1"
    with torch.no_grad():
        close(out.activation, ((m.fc(x).squeeze(-1) - target) ** 2).mean())


def test_int_bool_ops():
    h, _, (x,), _ = log("int_bool_ops")
    dtypes = {k: h[k].dtype for k in ("argmax_1_1", "gt_1_2", "and_1_4", "sum_1_5", "float_1_7")}
    assert dtypes == {
        "argmax_1_1": torch.int64,
        "gt_1_2": torch.bool,
        "and_1_4": torch.bool,
        "sum_1_5": torch.int64,
        "float_1_7": torch.float32,
    }
    both = (x > 0) & (x < 1)
    exact(h["and_1_4"].activation, both)
    exact(h["output.0"].activation, x.argmax(1) + both.sum(1))
    assert h["and_1_4"].parent_arg_positions == {"gt_1_2": [0], "lt_1_3": [1]}


def test_no_grad_part():
    h, m, (x,), _ = log("no_grad_part")
    first, second = h["fc:1"], h["fc:2"]
    assert (first.label, second.label) == ("linear_1_1:1", "linear_1_1:2")
    assert first.grad_fn_name is None and h["mean_1_2"].grad_fn_name is None
    assert second.grad_fn_name == "AddmmBackward0"
    assert h["output"].activation.requires_grad
    with torch.no_grad():
        y = m.fc(x)
    close(h["output"].activation, y - y.mean())


def test_constant_tensor_attribute():
    h, _, (x,), _ = log("constant_tensor_attribute")
    assert h.layer_labels == ["input_1_0", "mul_1_1", "output_1_2"]
    assert h["mul_1_1"].parent_arg_positions == {"input_1_0": [0]}
    close(h["mul_1_1"].activation, x * torch.tensor([1.0, -1.0, 2.0]))


def test_paramless_loop():
    h, _, (x,), _ = log("paramless_loop")
    adds = [e for e in h if e.layer_type == "add"]
    assert len(adds) == 3
    close(adds[-1].activation, x + 3)


def test_conditional_on_tensor():
    h, _, (x,), _ = log("conditional_on_tensor")
    assert [e.layer_type for e in h] == ["input", "sum", "gt", "mul", "output"]
    assert h["gt_1_2"].child_layers == [] and h["gt_1_2"].activation.item() is True
    close(h["output"].activation, x * 2)
    h2 = tl.log_forward_pass(models.ConditionalOnTensor(), -x)
    assert [e.layer_type for e in h2] == ["input", "sum", "gt", "sub", "output"]


def test_keyword_tensor_call():
    h, m, (x, y), _ = log("keyword_tensor_call")
    add = h["add_1_2"]
    assert add.parent_arg_positions == {"input_1_0": [0], "input_2_1": ["other"]}
    close(add.activation, x + 2 * y)
    lin = h["linear_1_3"]
    assert lin.parent_arg_positions == {"add_1_2": ["input"]} and lin.param_addresses == ("weight",)
    close(lin.activation, (x + 2 * y) * 2)


# ----- options of log_forward_pass ---------------------------------------------------------------
def test_layers_to_save_subsets():
    make_model, make_inputs = REGISTRY_BY_NAME["simple_feedforward"]
    model = make_model()
    (x,), _ = make_inputs()
    h = tl.log_forward_pass(model, x, layers_to_save=["fc2"])
    assert h.layer_labels == ["linear_2_3"] and h["fc2"].label == "linear_2_3"
    h = tl.log_forward_pass(model, x, layers_to_save="relu")
    assert h.layer_labels == ["relu_1_2"]
    h = tl.log_forward_pass(model, x, layers_to_save=["relu_1_2", 1])
    assert h.layer_labels == ["linear_1_1", "relu_1_2"]
    with torch.no_grad():
        close(h["relu_1_2"].activation, torch.relu(model.fc1(x)))
    h = tl.log_forward_pass(model, x, layers_to_save=["relu"], keep_unsaved_layers=True)
    assert len(h) == 5 and [e.activation is not None for e in h] == [False, False, True, False, False]
    with pytest.raises(KeyError, match="keep_unsaved_layers"):
        tl.log_forward_pass(model, x, layers_to_save=["relu"])["linear_1_1"]
    meta = tl.get_model_metadata(model, x)
    assert meta.layer_labels == ["input_1_0", "linear_1_1", "relu_1_2", "linear_2_3", "output_1_4"]
    assert all(e.activation is None for e in meta) and meta["relu_1_2"].shape == torch.Size([2, 4])
    with pytest.raises(ValueError, match="matches no layer"):
        tl.log_forward_pass(model, x, layers_to_save=["nonexistent_3"])


def test_postfunc_and_detach():
    make_model, make_inputs = REGISTRY_BY_NAME["simple_feedforward"]
    model = make_model()
    (x,), _ = make_inputs()
    h = tl.log_forward_pass(model, x, activation_postfunc=lambda t: t.sum(), detach_saved_tensors=True)
    with torch.no_grad():
        close(h["relu_1_2"].activation, torch.relu(model.fc1(x)).sum())
    assert not h["relu_1_2"].activation.requires_grad
    assert h["relu_1_2"].shape == torch.Size([2, 4])


# ----- regressions: bugs found while writing this catalogue, now fixed ---------------------------
def test_torch_namespace_inplace_function_is_logged():
    h, m, (x,), _ = log("inplace_torch_function")
    assert [e.layer_type for e in h] == ["input", "linear", "relu", "mul", "output"]
    relu = h["relu_1_2"]
    assert relu.is_inplace and relu.parent_layers == ["linear_1_1"]
    assert h["mul_1_3"].parent_layers == ["relu_1_2"]


def test_inplace_relu_module_flag():
    h, _, _, _ = log("inplace_relu_module")
    assert h["relu_1_2"].is_inplace


def test_layers_to_save_by_label_runs_stateful_model_once():
    model = models.BufferCounter()
    x = torch.ones(1, 3)
    h = tl.log_forward_pass(model, x, layers_to_save=["mul_1_3"])
    exact(model.count, torch.ones(1))
    exact(h["mul_1_3"].activation, x)


class _ReturnsBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.ones(2))

    def forward(self, x):
        return x * 2, self.b


def test_returned_buffer_has_buffer_layer():
    h = tl.log_forward_pass(_ReturnsBuffer(), torch.ones(2))
    (parent,) = h["output.1"].parent_layers
    assert h[parent].is_buffer and h[parent].address == "b"


@pytest.mark.parametrize(
    "name, address, before",
    [
        ("running_mean_inplace", "running_mean", torch.tensor([1.0, -2.0, 3.0])),
        ("batchnorm_train", "bn.running_mean", torch.zeros(3)),
    ],
)
def test_buffer_layer_saves_value_before_first_use(name, address, before):
    h, _, _, _ = log(name)
    exact(h[address].activation, before)


def test_error_note_names_submodule_for_python_errors():
    make_model, make_inputs = REGISTRY_BY_NAME["raises_in_submodule"]
    (x,), _ = make_inputs()
    with pytest.raises(ValueError) as info:
        tl.log_forward_pass(make_model(), x)
    assert any("inside module 'check'" in n for n in info.value.__notes__)


def test_unsaved_module_address_message():
    make_model, make_inputs = REGISTRY_BY_NAME["simple_feedforward"]
    (x,), _ = make_inputs()
    h = tl.log_forward_pass(make_model(), x, layers_to_save=["relu"])
    with pytest.raises(KeyError, match="keep_unsaved_layers"):
        h["fc1"]


def _ancestors(h, label):
    found, todo = set(), [label]
    while todo:
        for p in h[todo.pop()].parent_layers:
            if p not in found:
                found.add(p)
                todo.append(p)
    return found


def test_inplace_through_view_values():
    h, _, (x,), _ = log("inplace_through_view")
    assert h["mul_1_3"].is_inplace and h["mul_1_3"].parent_layers == ["getitem_1_2"]
    close(h["mul_1_3"].activation, x[0] * 10)
    expected = x.clone()
    expected[0] *= 10
    close(h["output"].activation, expected)


def test_inplace_through_view_feeds_output():
    """The write into y[0] gives y a new record (viewwrite) that the output depends on."""
    h, _, _, _ = log("inplace_through_view")
    assert "mul_1_3" in _ancestors(h, h.output_layers[0])
