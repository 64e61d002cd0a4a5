"""Weights-free tracing on the meta device (torchlens/trace/capture/meta.py, capture/sites.py)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchlens as tl
from torchlens.trace.render import build_dot

transformers = pytest.importorskip("transformers")

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
)


def _llama(meta: bool):
    config = transformers.LlamaConfig(**TINY_LLAMA)
    if meta:
        with torch.device("meta"):
            return transformers.LlamaForCausalLM(config).eval()
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _structure(history):
    return [
        (e.label, e.layer_type, tuple(e.shape or ()), e.dtype, tuple(e.parent_layers), tuple(e.param_addresses or ()))
        for e in history.layer_list
    ]


@pytest.fixture(scope="module")
def llama_pair():
    ids = torch.zeros(1, 8, dtype=torch.long)
    real = tl.log_forward_pass(_llama(False), ids, layers_to_save=None)
    meta = tl.log_forward_pass(_llama(True), ids.to("meta"))
    return real, meta


def test_meta_llama_traces_the_same_graph_as_real_weights(llama_pair):
    real, meta = llama_pair
    # torch's Python meta kernels once replaced each op by an 'empty' and the graph collapsed to 12 layers
    assert len(meta.layer_labels) == len(real.layer_labels) > 100
    assert _structure(meta) == _structure(real)
    assert [e.func_call_stack[-1].line_number for e in meta.layer_list if e.func_call_stack] == [
        e.func_call_stack[-1].line_number for e in real.layer_list if e.func_call_stack
    ]
    assert meta.module_addresses == real.module_addresses
    assert meta["lm_head"].activation.is_meta and meta["lm_head"].shape == (1, 8, 1000)
    assert any("meta device" in note for note in meta.notes)
    assert not any("meta device" in note for note in real.notes)


def test_meta_history_prints_draws_and_tabulates(llama_pair):
    _, meta = llama_pair
    assert "LlamaDecoderLayer" in str(meta)
    assert len(meta.to_pandas()) == len(meta.layer_labels)
    source = build_dot(meta).source
    assert "linear" in source and "scaleddotproductattention" in source


def test_meta_history_save_load_round_trip(llama_pair, tmp_path):
    _, meta = llama_pair
    meta.save(str(tmp_path / "run"))
    loaded = tl.load(str(tmp_path / "run"))
    assert loaded.layer_labels == meta.layer_labels
    for label in ("embedding_1_1", "linear_15_144", "output_1_145"):
        activation = loaded[label].activation
        assert activation.is_meta
        assert activation.shape == meta[label].activation.shape
        assert activation.dtype == meta[label].activation.dtype
    with pytest.raises(tl.MetaDeviceError):  # the note that says so was saved too
        loaded.rerun({"embedding_1_1": torch.zeros(1, 8, 64, device="meta")})


def test_device_meta_leaves_the_model_untouched():
    model = _llama(False)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    before = {name: (p, p.data_ptr(), p.requires_grad, p.device) for name, p in model.named_parameters()}
    buffers = {name: (b, b.data_ptr()) for name, b in model.named_buffers()}
    ids = torch.zeros(1, 8, dtype=torch.long)
    history = tl.log_forward_pass(model, ids, device="meta")
    assert history["lm_head"].activation.is_meta
    assert history.layer_labels == tl.log_forward_pass(model, ids, layers_to_save=None).layer_labels
    after = {name: (p, p.data_ptr(), p.requires_grad, p.device) for name, p in model.named_parameters()}
    assert all(after[n][0] is before[n][0] and after[n][1:] == before[n][1:] for n in before)
    assert {name: (b, b.data_ptr()) for name, b in model.named_buffers()} == buffers
    assert not ids.is_meta
    with pytest.raises(ValueError, match="only device='meta'"):
        tl.log_forward_pass(model, ids, device="cpu")


class _Branchy(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.linear(x)
        if self.kind == "if":
            if x.sum() > 0:
                x = x * 2
        elif self.kind == "item":
            x = x * x.sum().item()
        elif self.kind == "nonzero":
            x = x[x.nonzero()[:, 0]]
        else:
            x = x * len(x.tolist())
        return x


@pytest.mark.parametrize(
    "kind, line",
    [("if", "if x.sum() > 0:"), ("item", "x.sum().item()"), ("nonzero", "x.nonzero()"), ("tolist", "x.tolist()")],
)
def test_data_dependent_control_flow_names_the_line_and_the_way_out(kind, line):
    with torch.device("meta"):
        model = _Branchy(kind)
    with pytest.raises(tl.MetaDeviceError) as info:
        tl.log_forward_pass(model, torch.rand(2, 4, device="meta"))
    message = str(info.value)
    assert line in message and "test_meta.py" in message and "small real input" in message
    assert isinstance(info.value, tl.TorchlensError)


def test_validate_and_rerun_refuse_meta(llama_pair):
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.rand(2, 4, device="meta")
    with pytest.raises(tl.MetaDeviceError, match="meta device"):
        tl.validate_model_activations(model, x)
    history = tl.log_forward_pass(model, x, save_function_args=True)
    with pytest.raises(tl.MetaDeviceError, match="rerun needs tensor values"):
        history.rerun({"relu_1_2": torch.zeros(2, 4, device="meta")})
    with pytest.raises(tl.MetaDeviceError):
        tl.validate_history(history)
    with pytest.raises(tl.MetaDeviceError, match="compare"):
        tl.compare(history, history)


class _ShadowingMode(TorchDispatchMode):
    """Runs every operation as its own calls: what the model called is hidden behind them."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return torch.zeros_like(out) + out if isinstance(out, torch.Tensor) else out


def test_a_mode_that_hides_calls_is_noted_and_normal_passes_are_not():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.rand(1, 4)
    plain = tl.log_forward_pass(model, x)
    assert not any("mode" in note for note in plain.notes)
    with _ShadowingMode():
        hidden = tl.log_forward_pass(model, x)
    assert "linear" not in [e.layer_type for e in hidden.layer_list]  # the mode's calls replaced them
    assert any("_ShadowingMode" in note for note in hidden.notes)


def test_output_unconnected_to_inputs_is_noted():
    class Ignores(torch.nn.Module):
        def forward(self, x):
            return torch.ones(3) * 2

    history = tl.log_forward_pass(Ignores(), torch.rand(3))
    assert any("depends on any of its inputs" in note for note in history.notes)


def test_device_meta_moves_a_tensor_passed_twice_once():
    class Adds(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    x = torch.rand(3)
    real = tl.log_forward_pass(Adds(), [x], {"b": x}, layers_to_save=None)
    meta = tl.log_forward_pass(Adds(), [x], {"b": x}, device="meta")
    assert meta.layer_labels == real.layer_labels  # one input, as in the real pass


def test_meta_history_graph_page(llama_pair, tmp_path):
    _, meta = llama_pair
    html = meta.to_html(str(tmp_path / "page.html"))
    text = open(html).read() if not html.lstrip().startswith("<") else html
    assert "LlamaDecoderLayer" in text
