"""tl.memory_report: what a training step holds (saved for backward, params, grads, optimizer
state) and its FLOPs, counted by hand on small models, on meta, and against the allocator."""

import ctypes
import gc

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.flop_counter import FlopCounterMode

import torchlens as tl

F32 = 4


class LinearReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(100, 50)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


def test_linear_saves_its_input_and_relu_its_output():
    mem = tl.memory_report(LinearReLU(), torch.ones(8, 100))
    assert mem.per_op["linear_1_1"] == 8 * 100 * F32  # the input; the weight is a parameter
    assert mem.per_op["relu_1_2"] == 8 * 50 * F32  # its output
    assert mem.saved_for_backward == (8 * 100 + 8 * 50) * F32
    assert mem.saved_inputs == 8 * 100 * F32
    assert mem.params == (100 * 50 + 50) * F32


def test_a_saved_parameter_is_not_counted_twice():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1000))

        def forward(self, x):
            return (x * 2) * self.w  # mul saves both factors: the parameter is in params only

    mem = tl.memory_report(Scale(), torch.ones(1000))
    assert mem.params == 1000 * F32
    assert mem.saved_for_backward == 1000 * F32  # x * 2 only


def test_a_storage_saved_by_two_ops_counts_once_to_the_first():
    class Twice(nn.Module):
        def forward(self, x):
            y = x * 3
            return y.sin() + y.cos() + y[:10].exp().sum()  # sin and cos save y; exp saves its own output

    x = torch.ones(1000, requires_grad=True)
    mem = tl.memory_report(Twice(), x)
    assert mem.per_op["sin_1_2"] == 1000 * F32
    assert mem.per_op["cos_1_3"] == 0
    assert mem.per_op["exp_1_6"] == 10 * F32


def test_optimizer_state_sizes_and_frozen_parameters():
    model = nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 5)).to(torch.bfloat16)
    model[0].requires_grad_(False)
    x = torch.ones(3, 10, dtype=torch.bfloat16)
    trainable = 20 * 5 + 5
    sizes = {opt: tl.memory_report(model, x, optimizer=opt).optimizer_state for opt in (None, "sgd", "Adam", "adamw")}
    assert sizes == {None: 0, "sgd": trainable * F32, "Adam": 2 * trainable * F32, "adamw": 2 * trainable * F32}
    mem = tl.memory_report(model, x, optimizer="adam")
    assert mem.params == (10 * 20 + 20 + trainable) * 2
    assert mem.grads == trainable * 2
    assert model[0].weight.requires_grad is False and model[1].weight.requires_grad is True
    with pytest.raises(ValueError, match="'sgd'.*'adam'"):
        tl.memory_report(model, x, optimizer="lion")


def test_flops_follow_torchs_counter_and_backward_is_twice():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    x = torch.randn(2, 3, 16, 16)
    mem = tl.memory_report(model, x)
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert mem.forward_flops == counter.get_total_flops() > 0
    assert mem.flops_per_op["linear_1_4"] == 2 * 2 * 8 * 14 * 14 * 10
    assert mem.backward_flops == 2 * mem.forward_flops
    assert mem.flops_per_module["3:1"] == mem.flops_per_op["linear_1_4"]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x))) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = x.tanh()  # outside any module
        for block in self.blocks:
            x = block(x)
        return self.head(x).softmax(-1)


def test_per_module_sums_equal_the_total():
    mem = tl.memory_report(Net(), torch.randn(5, 16))
    top = {f"{a}:{p}" for e in mem.history.layer_list for a, p in e.module_stack[:1]}  # outermost calls
    assert top == {"blocks.0:1", "blocks.1:1", "head:1"}
    outside = sum(mem.per_op[e.label] for e in mem.history.layer_list if e.label in mem.per_op and not e.module_stack)
    assert outside > 0  # tanh and softmax save their outputs
    assert sum(mem.per_module[m] for m in top) + outside == mem.saved_for_backward
    inner = ("blocks.0.fc:1", "blocks.0.norm:1")
    assert mem.per_module["blocks.0:1"] >= sum(mem.per_module[m] for m in inner) > 0
    frame = mem.to_pandas()
    assert frame["saved_bytes"].sum() == mem.saved_for_backward
    assert frame["forward_flops"].sum() == mem.forward_flops
    modules = mem.to_pandas("module")
    assert dict(zip(modules["module"], modules["saved_bytes"])) == mem.per_module


def test_print_shows_totals_then_what_holds_the_most():
    mem = tl.memory_report(Net(), torch.randn(5, 16), optimizer="adam")
    text = str(mem)
    for line in ("parameters", "gradients", "optimizer state (adam)", "saved for backward", "peak (estimate)"):
        assert line in text
    assert text.index("peak (estimate)") < text.index("Ops holding the most") < text.index("Module calls holding")
    biggest = max(mem.per_op, key=mem.per_op.get)
    assert biggest in text.split("Ops holding the most")[1]
    parts = mem.params + mem.grads + mem.optimizer_state + mem.buffers + mem.saved_for_backward
    assert mem.peak_estimate == parts + mem.largest_transient


def test_the_reports_own_flop_counter_is_not_noted_as_a_users_mode():
    mem = tl.memory_report(Net(), torch.randn(5, 16), optimizer="adam")
    assert not any("torch mode was active" in note for note in mem.notes)
    with FlopCounterMode(display=False):  # a mode the caller entered is still noted
        mem = tl.memory_report(Net(), torch.randn(5, 16), optimizer="adam")
    assert any("FlopCounterMode" in note for note in mem.notes)


def test_model_and_torch_are_left_as_they_were():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    model[0].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tl.memory_report(model, torch.randn(6, 4), optimizer="sgd")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm stats too
    assert model.training and not model[0].weight.requires_grad and model[0].bias.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert not _get_current_dispatch_mode_stack()
    assert not torch._C._autograd._top_saved_tensors_default_hooks(False)

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tl.memory_report(Broken(), torch.ones(2))
    assert not _get_current_dispatch_mode_stack()
    assert not torch._C._autograd._top_saved_tensors_default_hooks(False)


def _llama(meta: bool, attention: str = "eager"):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000, attn_implementation=attention,
    )  # fmt: skip
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return transformers.LlamaForCausalLM(config)
    return transformers.LlamaForCausalLM(config)


def test_meta_model_gives_the_numbers_of_the_same_model_with_weights():
    ids = torch.zeros(2, 16, dtype=torch.long)
    real = tl.memory_report(_llama(False), ids, optimizer="adamw")
    meta = tl.memory_report(_llama(True), ids.to("meta"), optimizer="adamw")
    assert real.saved_for_backward > 0 and real.forward_flops > 0
    assert meta.per_op == real.per_op
    assert meta.flops_per_op == real.flops_per_op
    assert meta.per_module == real.per_module
    numbers = ("params", "grads", "optimizer_state", "saved_for_backward", "peak_estimate")
    assert [getattr(meta, n) for n in numbers] == [getattr(real, n) for n in numbers]
    model = _llama(False)
    weight = model.lm_head.weight
    on_meta = tl.memory_report(model, ids, optimizer="adamw", device="meta")  # real weights, meta pass
    assert on_meta.per_op == real.per_op and on_meta.peak_estimate == real.peak_estimate
    assert model.lm_head.weight is weight and not weight.is_meta
    assert not any("attention" in note for note in real.notes + meta.notes)


def test_attention_on_meta_counts_as_the_fused_kernel_does():
    """On meta, torch would run scaled_dot_product_attention by its math path, which keeps the
    attention probabilities; the report counts what the fused kernel (here the CPU's) keeps."""
    ids = torch.zeros(2, 16, dtype=torch.long)
    real = tl.memory_report(_llama(False, attention="sdpa"), ids)
    meta = tl.memory_report(_llama(True, attention="sdpa"), ids.to("meta"))
    assert any("scaleddotproductattention" in label for label in meta.per_op)
    assert meta.per_op == real.per_op and meta.flops_per_op == real.flops_per_op
    assert any("scaled_dot_product_attention" in note and "fused" in note for note in meta.notes)
    assert not any("scaled_dot_product_attention" in note for note in real.notes)
    assert "scaled_dot_product_attention" in str(meta)


def _allocated() -> int:
    """Bytes glibc's malloc has handed out (torch's CPU allocator uses it)."""

    class Info(ctypes.Structure):
        names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("no glibc mallinfo2 to measure the allocator with")
    mallinfo2.restype = Info
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def _held_by_graph(model, x) -> int:
    """What a forward with grad holds after it returns more than the same forward without."""

    def growth(grad: bool) -> int:
        gc.collect()
        start = _allocated()
        with torch.set_grad_enabled(grad):
            out = model(x)
        grown = _allocated() - start
        del out
        return grown

    return min(growth(True) - growth(False) for _ in range(2))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_saved_for_backward_matches_the_allocator(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        layers = [m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.ReLU())]
        model, x = nn.Sequential(*layers, nn.Linear(1024, 10)), torch.randn(512, 1024)
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.GELU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 32 * 32, 10),
        )  # fmt: skip
        x = torch.randn(16, 3, 64, 64)
    mem = tl.memory_report(model, x)
    expected = mem.saved_for_backward - mem.saved_inputs  # the input exists in both passes
    assert expected > 4 * 2**20
    assert _held_by_graph(model, x) == pytest.approx(expected, rel=0.15)


def test_meta_llama_flops_are_the_planning_formula():
    """Forward FLOPs of a meta LLaMA: 2 x tokens x the weights of its linear layers, plus
    attention's two matmuls (4 x batch x heads x seq^2 x head_dim per layer, as torch counts)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=2000,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    batch, seq = 2, 64
    mem = tl.memory_report(model, torch.zeros(batch, seq, dtype=torch.long, device="meta"), optimizer="adamw")
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    attention = 4 * batch * 8 * seq * seq * (256 // 8) * 3
    assert mem.forward_flops == 2 * batch * seq * linear_weights + attention
    n = sum(p.numel() for p in model.parameters())
    assert (mem.params, mem.grads, mem.optimizer_state) == (2 * n, 2 * n, 8 * n)
    assert all(p.is_meta for p in model.parameters())


def _live_tensor_bytes() -> int:
    gc.collect()
    return sum(o.numel() * o.element_size() for o in gc.get_objects() if type(o) is torch.Tensor)


def test_a_report_keeps_nothing_of_the_pass_alive():
    """After it returns only numbers remain: the pass's saved tensors (ReLU and Tanh save their
    own outputs) were once kept alive by a cycle through autograd, 1.4 GB for 8 ResNet reports."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 10))
    x = torch.randn(64, 256)
    before = _live_tensor_bytes()
    reports = [tl.memory_report(model, x, optimizer="adam") for _ in range(4)]
    assert _live_tensor_bytes() - before == 0
    assert reports[0].saved_for_backward == (64 * 256 + 2 * 64 * 1024) * F32  # it did measure them


def test_the_optimizer_object_the_user_holds_is_measured():
    model = nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 5))
    x = torch.ones(3, 10)
    elements = sum(p.numel() for p in model.parameters())
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    mem = tl.memory_report(model, x, optimizer=adam)  # before any step: from its class
    assert mem.optimizer_state == 2 * elements * F32 and "optimizer state (Adam)" in str(mem)
    amsgrad = torch.optim.AdamW(model.parameters(), amsgrad=True)
    assert tl.memory_report(model, x, optimizer=amsgrad).optimizer_state == 3 * elements * F32
    rms = torch.optim.RMSprop(model.parameters(), momentum=0.9, centered=True)
    model(x).sum().backward()
    rms.step()  # its state now exists: measured
    held = sum(v.numel() * v.element_size() for s in rms.state.values() for v in s.values() if v.dim() > 0)
    assert tl.memory_report(model, x, optimizer=rms).optimizer_state == held == 3 * elements * F32
    assert tl.memory_report(model, x, optimizer=torch.optim.SGD).optimizer_state == 0  # momentum 0 by default
    assert tl.memory_report(model, x, optimizer=torch.optim.Adagrad).optimizer_state == elements * F32


def test_an_unknown_optimizer_says_what_to_pass_or_add_with_attributes_that_exist():
    model, x = nn.Linear(4, 2), torch.ones(1, 4)

    class Mine(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

    with pytest.raises(ValueError) as caught:
        tl.memory_report(model, x, optimizer=Mine(model.parameters()))
    message = str(caught.value)
    assert "after one optimizer.step()" in message and "Parameter containing" not in message  # no repr
    for text in (message, str(pytest.raises(ValueError, tl.memory_report, model, x, optimizer="lion").value)):
        for attribute in ("mem.grads", "mem.peak_estimate"):
            assert attribute in text and hasattr(tl.memory_report(model, x), attribute.split(".")[1])
        assert "params_fp32" not in text


@pytest.mark.cuda
def test_a_report_on_the_gpu_leaves_no_gpu_memory_behind():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.Tanh(), nn.Linear(4096, 8)).cuda()
    x = torch.randn(256, 512, device="cuda")
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    reports = [tl.memory_report(model, x, optimizer=torch.optim.AdamW(model.parameters())) for _ in range(3)]
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert reports[-1].saved_for_backward >= 3 * 256 * 4096 * F32


def test_an_inference_plan_counts_the_kv_cache_at_batch_times_sequence():
    batch, seq, layers, kv_heads, head_dim = 8, 512, 2, 2, 16  # _llama: hidden 64 over 4 heads, 2 kv heads
    meta = tl.memory_report(
        _llama(True, attention="sdpa"), torch.zeros(batch, seq, dtype=torch.long, device="meta"), {"use_cache": True},
        training=False,
    )  # fmt: skip
    assert meta.cache == 2 * layers * batch * kv_heads * head_dim * seq * F32  # keys and values
    assert meta.grads == meta.optimizer_state == meta.saved_for_backward == 0
    assert meta.peak_estimate == meta.params + meta.buffers + meta.cache + meta.largest_transient
    text = str(meta)
    assert text.startswith("Memory of inference with LlamaForCausalLM") and "KV cache (past_key_values)" in text
    assert "2.0 MB" in text and "backward" not in text
    real = tl.memory_report(_llama(False), torch.zeros(2, 16, dtype=torch.long), {"use_cache": True}, training=False)
    assert real.cache == 2 * layers * 2 * kv_heads * head_dim * 16 * F32
    with pytest.raises(ValueError, match="inference plan.*no optimizer"):
        tl.memory_report(_llama(False), torch.zeros(1, 4, dtype=torch.long), optimizer="adam", training=False)
