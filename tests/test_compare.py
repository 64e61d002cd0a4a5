"""tl.compare and tl.compare_precision: which op of one pass is which of another, and where
two passes part (the origin of a difference, not the ops it flowed into)."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torchlens as tl
from torchlens.errors import TorchlensError
from torchlens.trace.answers import CompareError, NothingInCommonError
from torchlens.trace.answers.comparison.difference import difference
from torchlens.trace.records.tensor_log import TensorLogEntry


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.blocks(self.inp(x)).relu())


class OtherBlock(nn.Module):
    """Block re-implemented: other class and attribute names, a functional gelu, one more op."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, h):
        y = F.gelu(self.up(self.ln(h))).contiguous()
        return self.down(y) + h


class Port(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList([OtherBlock() for _ in range(3)])
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(torch.relu(h))


def port_of(net: Net) -> Port:
    port = Port()
    values = list(net.state_dict().values())
    port.load_state_dict(dict(zip(port.state_dict(), values)))
    return port


def state(model: nn.Module):
    return {k: v.clone() for k, v in model.state_dict().items()}, [m.training for m in model.modules()]


def same_state(model: nn.Module, before) -> bool:
    values, flags = before
    now = model.state_dict()
    return all(torch.equal(now[k], v) and now[k].dtype == v.dtype for k, v in values.items()) and flags == [
        m.training for m in model.modules()
    ]


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net()


def test_one_weight_changed_in_the_middle_is_the_origin(net):
    changed = copy.deepcopy(net)
    with torch.no_grad():
        changed.blocks[1].fc2.weight[0, 0] += 0.5
    before_a, before_b = state(net), state(changed)
    x = torch.randn(3, 4)
    x_before = x.clone()
    cmp = tl.compare((net, x), (changed, x))
    origin = cmp.first_divergence
    assert origin is not None, str(cmp)
    assert origin.module == "blocks.1.fc2" and origin.layer_type == "linear", str(cmp)
    assert [r.label for r in cmp.origins] == [origin.label]
    # everything before it is equal, everything after it (downstream) differs
    order = [r.label for r in cmp.rows]
    assert all(r.within for r in cmp.rows[: order.index(origin.label)])
    assert not any(r.within for r in cmp.rows[order.index(origin.label) :])
    assert origin.source is not None and "self.fc2(" in origin.source.code_line
    text = str(cmp)
    assert text.splitlines()[1].startswith(f"First divergence: {origin.label}")
    assert same_state(net, before_a) and same_state(changed, before_b) and torch.equal(x, x_before)


def test_equal_passes_have_no_divergence(net):
    x = torch.randn(2, 4)
    a = tl.log_forward_pass(net, x)
    b = tl.log_forward_pass(net, x)
    cmp = tl.compare(a, b)
    assert cmp.first_divergence is None and cmp.equal
    assert cmp.matched_by_label and len(cmp.rows) == len(a.layer_list)
    assert "Every matched op is within tolerance." in str(cmp)


def test_a_reimplementation_with_other_names_is_matched_and_equal(net):
    port = port_of(net)
    x = torch.randn(3, 4)
    cmp = tl.compare((net, x), (port, x))
    a, b = cmp.history_a, cmp.history_b
    assert not cmp.matched_by_label
    assert len(cmp.rows) == len(a.layer_list), cmp.unmatched_a  # every op of the reference matched
    assert sorted(b[x].layer_type for x in cmp.unmatched_b) == ["contiguous"] * 3
    assert cmp.first_divergence is None and cmp.equal, str(cmp)
    # the second block's fc2 is the port's layers.1.down, and its residual add is the port's add
    rows = {(r.module, r.layer_type): r for r in cmp.rows}
    fc2 = rows[("blocks.1.fc2", "linear")]
    assert b[fc2.label_b].containing_module == "layers.1.down"
    add = [r for r in cmp.rows if r.layer_type == "add"][1]
    assert b[add.label_b].containing_module == "layers.1"


def test_a_port_with_a_changed_weight_names_the_port_s_module(net):
    port = port_of(net)
    with torch.no_grad():
        port.layers[2].up.bias[3] += 1.0
    x = torch.randn(3, 4)
    cmp = tl.compare((net, x), (port, x))
    origin = cmp.first_divergence
    assert origin is not None and origin.module == "blocks.2.fc1", str(cmp)
    assert cmp.history_b[origin.label_b].containing_module == "layers.2.up"


def test_different_input_sizes_report_shapes(net):
    cmp = tl.compare((net, torch.randn(3, 4)), (net, torch.randn(5, 4)))
    first = cmp.first_divergence
    assert first is not None and first.label.startswith("input") and not first.same_shape
    assert (first.shape_a, first.shape_b) == ((3, 4), (5, 4))
    assert all(not r.same_shape and not r.within for r in cmp.rows)
    assert "(3, 4) vs (5, 4)" in str(cmp)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(torch.sigmoid(self.conv(x))).flatten(1).sum(1)


def test_nothing_in_common_is_a_clear_error(net):
    with pytest.raises(NothingInCommonError) as caught:
        tl.compare((net, torch.randn(1, 4)), (Conv(), torch.randn(1, 1, 6, 6)))
    assert isinstance(caught.value, TorchlensError) and isinstance(caught.value, ValueError)
    assert "nothing in common" in str(caught.value) and "Conv" in str(caught.value)


def test_missing_saved_layers_are_named(net):
    x = torch.randn(2, 4)
    full = tl.log_forward_pass(net, x)
    part = tl.log_forward_pass(net, x, layers_to_save=["linear_1_1", "output"])
    with pytest.raises(CompareError) as caught:
        tl.compare(full, part)
    message = str(caught.value)
    assert "history b lacks" in message and "layernorm_1_2" in message and "relu_1_17" in message
    assert "layers_to_save=" in message and "linear_1_1" not in message.split("layers_to_save=")[0]
    # the same subset on both sides compares what both kept
    cmp = tl.compare(tl.log_forward_pass(net, x, layers_to_save=["linear_1_1", "output"]), part)
    assert [r.label for r in cmp.rows] == ["linear_1_1", "output_1_19"] and cmp.equal


def test_metadata_only_history_is_refused(net):
    x = torch.randn(2, 4)
    with pytest.raises(CompareError, match="no saved activations"):
        tl.compare(tl.log_forward_pass(net, x), tl.log_forward_pass(net, x, layers_to_save=None))


class Threshold(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        y = x * self.scale
        return y > 1.0, (y * 10).long()


def test_integer_and_bool_values_are_compared_exactly():
    x = torch.tensor([1.0, 0.5, 0.35])
    cmp = tl.compare((Threshold(1.0), x), (Threshold(1.0 + 1e-6), x))
    by_type = {r.layer_type: r for r in cmp.rows}
    assert by_type["mul"].within  # the floats agree within rtol=1e-3
    assert by_type["gt"].exact and not by_type["gt"].within and by_type["gt"].is_origin, str(cmp)
    assert by_type["long"].exact and by_type["long"].within
    assert cmp.first_divergence.layer_type == "gt"


def test_complex_values_compare_by_magnitude_of_difference():
    d = difference(torch.tensor([1 + 1j, 2 + 0j]), torch.tensor([1 + 0j, 2 + 0j]), rtol=1e-3, atol=1e-5)
    assert not d.within and d.max_abs == pytest.approx(1.0) and d.max_rel == pytest.approx(1.0)
    assert difference(torch.tensor([3 + 4j]), torch.tensor([3 + 4j]), rtol=0.0, atol=0.0).within


def test_nan_and_inf_in_the_same_places_agree():
    a = torch.tensor([float("nan"), float("inf"), 1.0])
    assert difference(a, a.clone(), rtol=1e-3, atol=1e-5).within
    d = difference(a, torch.tensor([1.0, float("inf"), 1.0]), rtol=1e-3, atol=1e-5)
    assert not d.within and d.max_abs == float("inf")


def test_loaded_histories_are_read_one_op_at_a_time(net, tmp_path):
    changed = copy.deepcopy(net)
    with torch.no_grad():
        changed.blocks[0].fc1.bias += 0.1
    x = torch.randn(2, 4)
    in_memory = tl.compare(tl.log_forward_pass(net, x, random_seed=1), tl.log_forward_pass(changed, x, random_seed=1))
    a = tl.load(tl.log_forward_pass(net, x).save(str(tmp_path / "a")))
    b = tl.load(tl.log_forward_pass(changed, x).save(str(tmp_path / "b")))
    cmp = tl.compare(a, b)
    assert [(r.label, r.within, r.max_abs) for r in cmp.rows] == [
        (r.label, r.within, r.max_abs) for r in in_memory.rows
    ]
    kept = [TensorLogEntry.__dict__["activation"].__get__(e) for h in (a, b) for e in h.layer_list]
    assert all(v is None for v in kept), "compare kept activations read from disk on the entries"
    assert all(e.has_saved_activation for e in a.layer_list)


def test_table_values_for_an_overlay(net):
    pytest.importorskip("pandas")
    changed = copy.deepcopy(net)
    with torch.no_grad():
        changed.head.bias += 1.0
    cmp = tl.compare((net, torch.randn(2, 4)), (changed, torch.randn(2, 4)), random_seed=3)
    frame = cmp.to_pandas()
    assert len(frame) == len(cmp.rows) and {"label_a", "label_b", "max_abs", "max_rel", "cosine"} <= set(frame)
    values = cmp.values("max_abs")
    assert set(values) == {r.label for r in cmp.rows}
    assert cmp.row("linear_8_18").max_abs == values["linear_8_18"] > 0


def test_bad_arguments_say_what_to_pass(net):
    with pytest.raises(TypeError, match=r"\(model, args\)"):
        tl.compare(net, net)


def gpt2(dtype=torch.float32):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, attn_implementation="eager")
    return transformers.GPT2Model(config).eval(), torch.randint(0, config.vocab_size, (1, 16))


LAYOUT = {"view", "reshape", "transpose", "permute", "contiguous", "split", "dropout", "output", "getitem"}


def test_gpt2_bfloat16_precision_ranks_ops_that_compute():
    model, ids = gpt2()
    before = state(model)
    cmp = tl.compare_precision(model, ids, {"use_cache": False}, dtype=torch.bfloat16)
    assert same_state(model, before) and next(model.parameters()).dtype == torch.float32
    assert cmp.first_divergence is not None
    ranked = cmp.ranking
    assert ranked and all(r.added > 0 for r in ranked)
    # layout ops copy their parent's values: they add no error of their own
    assert not LAYOUT & {r.layer_type for r in ranked}, [r.label for r in ranked]
    assert {"matmul", "addmm", "layernorm", "softmax", "baddbmm"} & {r.layer_type for r in ranked[:5]}
    # the attention mask (finfo(bfloat16).min against float64's) is not an error
    assert all(r.mean_rel < 0.5 for r in ranked), [(r.label, r.mean_rel) for r in ranked]
    text = str(cmp)
    assert text.splitlines()[2].strip().startswith(ranked[0].label)


def test_gpt2_float32_against_bfloat16_diverges():
    model, ids = gpt2()
    low = copy.deepcopy(model).to(torch.bfloat16)
    cmp = tl.compare((model, ids, {"use_cache": False}), (low, ids, {"use_cache": False}), rtol=1.6e-2)
    assert cmp.matched_by_label and cmp.first_divergence is not None
    assert cmp.first_divergence.layer_type not in LAYOUT


def test_softmax_of_large_logits_stands_out():
    class Model(nn.Module):
        def forward(self, x):
            return torch.softmax(x * 30, dim=-1)

    cmp = tl.compare_precision(Model(), torch.randn(4, 16), dtype=torch.float16, random_seed=0)
    assert cmp.ranking[0].layer_type == "softmax", str(cmp)
    assert inspect.signature(tl.compare_precision).parameters["dtype"].default is torch.bfloat16


def test_traced_here_rearranged_ops_take_their_parent_s_numbers_exactly():
    """compare((model, x), ...) skips measuring views and transposes again; the numbers are those
    of measuring every op of the same two histories."""
    model, ids = gpt2()
    low = copy.deepcopy(model)
    with torch.no_grad():
        low.h[1].mlp.c_fc.weight.mul_(1.01)
    traced = tl.compare((model, ids, {"use_cache": False}), (low, ids, {"use_cache": False}), random_seed=0)
    measured = tl.compare(traced.history_a, traced.history_b)
    assert any(r.layer_type in ("view", "transpose") and not r.within for r in traced.rows)
    assert len(traced.rows) == len(measured.rows)
    for r, m in zip(traced.rows, measured.rows):
        assert (r.label, r.within, r.is_origin) == (m.label, m.within, m.is_origin)
        for name in ("max_abs", "max_rel", "mean_rel", "rel_error", "cosine"):
            got, want = getattr(r, name), getattr(m, name)
            assert got == want if want is None else got == pytest.approx(want, rel=1e-5, abs=1e-12), (r.label, name)


def test_gpt2_wrapped_under_another_address_with_an_extra_op_matches_every_op():
    """Another address for every module (gpt.h.0 against h.0) and one extra op shift every label:
    the module calls are aligned and every op of the plain model finds its counterpart."""
    model, ids = gpt2()

    class Wrapped(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.gpt = inner

        def forward(self, input_ids):
            return self.gpt(input_ids.contiguous(), use_cache=False)

    cmp = tl.compare((model, ids, {"use_cache": False}), (Wrapped(model), ids), random_seed=0)
    a, b = cmp.history_a, cmp.history_b
    assert not cmp.matched_by_label and len(cmp.rows) == len(a.layer_list)
    assert [b[x].layer_type for x in cmp.unmatched_b] == ["contiguous"]
    assert cmp.first_divergence is None, str(cmp)
    for r in cmp.rows:
        module_b = b[r.label_b].containing_module
        assert (r.module is None and module_b in (None, "gpt")) or module_b == f"gpt.{r.module}", r


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))


class Scaled(Plain):
    def forward(self, x):
        return self.out(torch.relu(self.fc(x) * 1.5))


def test_an_op_only_one_side_has_is_named_at_the_origin():
    plain, scaled = Plain(), Scaled()
    scaled.load_state_dict(plain.state_dict())
    x = torch.randn(2, 4)
    cmp = tl.compare((plain, x), (scaled, x))
    assert [cmp.history_b[x].layer_type for x in cmp.unmatched_b] == ["mul"]
    origin = cmp.first_divergence
    assert origin.layer_type == "relu" and origin.parents == ["linear_1_1"]
    assert f"{cmp.unmatched_b[0]} (b)" in origin.note and origin.note in str(cmp)


def test_a_compiled_model_compares_as_its_eager_self_and_says_why():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(2, 4)
    cmp = tl.compare((model, x), (torch.compile(model), x))
    assert cmp.matched_by_label and cmp.equal
    assert any(note.startswith("b: torch.compile") for note in cmp.notes) and "Note: b: torch.compile" in str(cmp)


def test_import_torchlens_does_not_load_compare():
    import subprocess
    import sys

    probe = (
        "import sys, torchlens as tl\n"
        "print('torchlens.trace.answers.comparison' in sys.modules)\n"
        "tl.compare, tl.compare_precision\n"
        "print('torchlens.trace.answers.comparison' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.splitlines() == ["False", "True"]


class _Recurrent(nn.Module):
    """A cell applied once per time step, then a head: runs of different lengths differ in passes."""

    def __init__(self):
        super().__init__()
        self.cell, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 4)
        for t in range(x.shape[1]):
            h = torch.tanh(self.cell(h) + x[:, t])
        return self.head(h)


def test_runs_of_different_lengths_pair_the_head_with_the_head_not_the_next_step_of_the_cell():
    torch.manual_seed(0)
    model = _Recurrent()
    short = tl.log_forward_pass(model, torch.randn(1, 3, 4))
    long = tl.log_forward_pass(model, torch.randn(1, 5, 4))
    cmp = tl.compare(short, long)
    pairs = {r.label_a: r.label_b for r in cmp.rows}
    # the short run's last state feeds the head; in the long run the same state feeds the cell's
    # 4th step, also a linear: that one lies in another module call, so it is not the head's match
    assert pairs[short["head"].label] == long["head"].label
    left = [long[label] for label in cmp.unmatched_b if long[label].layer_type == "linear"]
    assert len(left) == 2 and {e.containing_module for e in left} == {"cell"}  # steps 4 and 5


# ----- what a user reads when the passes differ by design (issue 42) ----------------------------
def test_a_float32_and_a_bfloat16_copy_are_said_to_differ_in_dtype():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    low = copy.deepcopy(model).to(torch.bfloat16)
    x = torch.randn(2, 8)
    text = str(tl.compare((model, x), (low, x.to(torch.bfloat16)), random_seed=0))
    said = text.splitlines()[1]
    assert said.startswith("Dtypes differ: a computes in float32, b in bfloat16")
    assert "tl.compare_precision(model, x, dtype=torch.bfloat16)" in said and "rtol=0.016" in said
    same = str(tl.compare((model, x), (copy.deepcopy(model), x), random_seed=0))
    assert "Dtypes differ" not in same


def test_cosine_is_never_printed_above_one():
    """Rounding in float32 norms made it 1.000001 for a tensor of ~3e5 values near 5."""

    class Scale(nn.Module):
        def forward(self, v):
            return v * 2

    g = torch.Generator().manual_seed(2)
    n = int(torch.randint(2, 300000, (1,), generator=g))
    x = torch.rand(n, generator=g) + 5
    y = x.clone()
    y[0] += 1e-2
    cmp = tl.compare((Scale(), x), (Scale(), y), rtol=0, atol=0, random_seed=0)
    assert all(r.cosine is None or -1.0 <= r.cosine <= 1.0 for r in cmp.rows)
    printed = [line.split()[-1] for line in str(cmp).splitlines() if line.startswith(("!", "x"))]
    assert printed and all(float(c) <= 1.0 for c in printed), printed


def test_a_model_that_cannot_run_in_the_dtype_says_so():
    class Complex(nn.Module):
        def forward(self, x):
            return torch.complex(x, 2 * x).abs()  # torch has no bfloat16 complex numbers

    with pytest.raises(RuntimeError) as caught:
        tl.compare_precision(Complex(), torch.randn(2, 4), dtype=torch.bfloat16)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "compare_precision ran a copy of the model in torch.bfloat16" in notes and "torch.float32" in notes
    assert tl.compare_precision(Complex(), torch.randn(2, 4), dtype=torch.float32) is not None
