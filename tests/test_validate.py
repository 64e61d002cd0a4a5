"""validate_model_activations: says True for correct logs, False (with the reason) otherwise."""

import pytest
import torch
from models import REGISTRY
from torch import nn

import torchlens as tl
import torchlens.trace.api as api_module
import torchlens.trace.validate as validate_module

# Models that raise on purpose.
EXPECTED_NOT_VALID = {"raises_midway", "raises_in_submodule"}


@pytest.mark.parametrize(
    "name, make_model, make_inputs",
    [r for r in REGISTRY if r[0] not in EXPECTED_NOT_VALID],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_catalogue_models_validate(name, make_model, make_inputs):
    args, kwargs = make_inputs()
    assert tl.validate_model_activations(make_model(), list(args), kwargs, random_seed=0, verbose=True)


def test_write_through_a_view_is_replayed():
    class ViewWrite(nn.Module):
        def forward(self, x):
            y = torch.zeros(2, 3)
            y[1].copy_(x)
            return y * 2

    h = tl.log_forward_pass(ViewWrite(), torch.rand(3))
    assert h.layer_labels == [
        "input_1_0",
        "zeros_1_1",
        "getitem_1_2",
        "copy_1_3",
        "viewwrite_1_4",
        "mul_1_5",
        "output_1_6",
    ]
    assert h["viewwrite_1_4"].parent_layers == ["zeros_1_1", "copy_1_3"]
    assert tl.validate_model_activations(ViewWrite(), torch.rand(3), verbose=True)


def test_a_corrupted_activation_is_caught(monkeypatch, capsys):
    real = api_module.log_forward_pass

    def corrupting(*args, **kwargs):
        history = real(*args, **kwargs)
        history["relu_1_2"].activation.add_(1.0)
        return history

    monkeypatch.setattr(api_module, "log_forward_pass", corrupting)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    assert not tl.validate_model_activations(model, torch.rand(2, 3), verbose=True)
    assert "relu_1_2" in capsys.readouterr().out


@pytest.mark.parametrize("corrupt", [None, "relu_1_2", "linear_2_3"])
def test_verdicts_left_on_a_device_are_read_once_at_the_end(monkeypatch, capsys, corrupt):
    """What a GPU does (one read of every comparison at the end, not one wait per operation),
    played on the CPU: the CPU's answers are left pending as a GPU's are."""
    import torchlens.trace.verdicts as verdicts

    monkeypatch.setattr(verdicts, "READ_AT_ONCE", frozenset({"meta"}))
    reads = []
    real_failed = verdicts.Verdicts.failed

    def failed(self):
        reads.append(sum(len(p) for p in self._pending.values()))
        return real_failed(self)

    monkeypatch.setattr(verdicts.Verdicts, "failed", failed)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    history = tl.log_forward_pass(model, torch.rand(2, 3), save_function_args=True)
    if corrupt:
        history[corrupt].activation.add_(1.0)
    assert validate_module.validate_history(history, verbose=True) is (corrupt is None)
    assert reads == [4]  # the answers of three operations and the output, read together
    out = capsys.readouterr().out
    assert (corrupt in out and "largest difference 1" in out) if corrupt else out == ""


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="needs float8")
def test_float8_activations_are_compared(capsys):
    class Float8(nn.Module):
        def forward(self, x):
            return x.to(torch.float8_e4m3fn).abs().float() * 2

    history = tl.log_forward_pass(Float8(), torch.randn(5), save_function_args=True)
    assert validate_module.validate_history(history)
    history["abs_1_2"].activation = torch.full((5,), 3.0).to(torch.float8_e4m3fn)
    assert not validate_module.validate_history(history, verbose=True)
    assert "abs_1_2" in capsys.readouterr().out


def test_a_fake_edge_is_caught(monkeypatch, capsys):
    """An edge to a tensor the call was not given is reported, even when the graph lists it on
    both sides."""
    real = api_module.log_forward_pass

    def with_fake_parent(*args, **kwargs):
        history = real(*args, **kwargs)
        entry, fake = history["relu_1_2"], history["input_1_0"]
        entry.parent_layers = entry.parent_layers + ["input_1_0"]
        entry.parent_arg_positions = {**entry.parent_arg_positions, "input_1_0": [1]}
        fake.child_layers = fake.child_layers + ["relu_1_2"]
        return history

    monkeypatch.setattr(api_module, "log_forward_pass", with_fake_parent)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    assert not tl.validate_model_activations(model, torch.rand(2, 3), verbose=True)
    assert (
        "relu_1_2: parent input_1_0 is recorded as argument 1, but the saved call does not have it among its arguments"
    ) in capsys.readouterr().out


def test_model_and_rng_left_as_found():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.3)).train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(5, 4)
    torch.manual_seed(9)
    expected = torch.rand(3)
    torch.manual_seed(9)
    assert tl.validate_model_activations(model, x, random_seed=2)
    assert torch.equal(torch.rand(3), expected)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert model.training


def test_validation_pauses_automatic_collection_and_leaves_it_as_found():
    """A collection during the replays would promote the history under check, and the full
    collections that promotion triggers walk every object of the process."""
    import gc

    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(gc.isenabled())
            return x * 2

    assert gc.isenabled()
    assert tl.validate_model_activations(Probe(), torch.rand(3))
    assert len(seen) == 2 and not any(seen)  # the plain run and the logged one
    assert gc.isenabled()
    gc.disable()
    try:
        assert tl.validate_model_activations(Probe(), torch.rand(3))
        assert not gc.isenabled()  # the caller's choice is kept
    finally:
        gc.enable()


def test_the_old_value_of_an_out_tensor_is_not_a_parent():
    class Out(nn.Module):
        def forward(self, x):
            buf = x * 3
            torch.add(x, 1, out=buf)  # overwrites buf: its old value is not read
            return buf * 2

    h = tl.log_forward_pass(Out(), torch.rand(3), save_function_args=True)
    assert h["add_1_2"].parent_layers == ["input_1_0"]
    assert h["mul_1_1"].child_layers == []
    assert tl.validate_model_activations(Out(), torch.rand(3), verbose=True)


def test_spectral_norm_in_train_mode_validates():
    """spectral_norm's power iteration writes into its u and v buffers with out=."""
    torch.manual_seed(0)
    model = nn.utils.spectral_norm(nn.Linear(4, 3)).train()
    assert tl.validate_model_activations(model, torch.rand(2, 4), random_seed=0, verbose=True)


class _Then(nn.Module):
    """A linear layer followed by ``f``: ``f``'s result may ignore the linear's values."""

    def __init__(self, f):
        super().__init__()
        self.f = f
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.f(self.lin(x))


def _while_not_flipping(h):
    while h.mean() > 100:  # never true for these inputs
        h = h * 2
    return h + 1


def _write_into_zeroed_view(h):
    x = h * 0
    y = x[0]
    y[:] = 1
    return x


class _LSTMTimesZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 4, batch_first=True)

    def forward(self, x):
        out, _ = self.lstm(x)
        return out * 0


IGNORES_A_PARENT = {
    "times_zero": lambda h: h * 0,
    "minus_itself": lambda h: h - h,
    "clamp_to_a_point": lambda h: torch.clamp(h, min=0.5, max=0.5),
    "softmax_over_one": lambda h: torch.softmax(h.unsqueeze(-1), dim=-1),
    "where_all_true": lambda h: torch.where(torch.ones_like(h, dtype=torch.bool), h, h * 3),
    "masked_fill_everything": lambda h: h.masked_fill(torch.ones_like(h, dtype=torch.bool), 2.0),
    "while_not_flipping": _while_not_flipping,
    "write_into_zeroed_view": _write_into_zeroed_view,
}


@pytest.mark.parametrize("name", sorted(IGNORES_A_PARENT))
def test_a_result_that_ignores_a_parent_is_no_false_alarm(name):
    """The replay proves the trace; that another parent value would give the same result says
    nothing against it."""
    model = _Then(IGNORES_A_PARENT[name])
    assert tl.validate_model_activations(model, torch.rand(2, 4), random_seed=0, verbose=True)


def test_an_lstm_output_times_zero_is_no_false_alarm():
    assert tl.validate_model_activations(_LSTMTimesZero(), torch.rand(2, 3, 4), random_seed=0, verbose=True)


def test_a_lost_edge_is_caught(monkeypatch, capsys):
    """A logged tensor the call used, but not listed as a parent, is a lost edge when the
    result depends on it."""
    real = api_module.log_forward_pass

    def without_edge(*args, **kwargs):
        history = real(*args, **kwargs)
        entry, parent = history["add_1_3"], history["linear_1_1"]
        entry.parent_layers = [p for p in entry.parent_layers if p != "linear_1_1"]
        entry.parent_arg_positions = {p: v for p, v in entry.parent_arg_positions.items() if p != "linear_1_1"}
        parent.child_layers = [c for c in parent.child_layers if c != "add_1_3"]
        return history

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            h = self.lin(x)
            return torch.relu(h) + h

    monkeypatch.setattr(api_module, "log_forward_pass", without_edge)
    assert not tl.validate_model_activations(Residual(), torch.rand(2, 3), random_seed=0, verbose=True)
    assert "add_1_3: its result depends on the value of linear_1_1" in capsys.readouterr().out


def test_an_ignored_argument_that_is_not_a_parent_is_fine():
    """broadcast_tensors: output 0 comes from argument 0 only, though the call got both."""

    class Broadcast(nn.Module):
        def forward(self, a, b):
            x, y = torch.broadcast_tensors(a, b)
            return x * 2, y * 3

    h = tl.log_forward_pass(Broadcast(), [torch.rand(3, 1), torch.rand(1, 4)], save_function_args=True)
    first = next(e for e in h if e.func_name == "broadcast_tensors" and e.output_index == 0)
    assert first.parent_layers == ["input_1_0"]
    assert validate_module.validate_history(h, verbose=True)


def test_validate_history_refuses_what_it_cannot_check():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with pytest.raises(ValueError, match="save_function_args=True"):
        validate_module.validate_history(tl.log_forward_pass(model, torch.rand(2, 3)))
    with pytest.raises(ValueError, match="layers_to_save='all'"):
        validate_module.validate_history(
            tl.log_forward_pass(model, torch.rand(2, 3), layers_to_save=["relu"], save_function_args=True)
        )
    with pytest.raises(TypeError, match="history takes a ModelHistory"):
        validate_module.validate_history([1, 2])


def test_validate_history_compares_the_outputs(capsys):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.rand(2, 3)
    h = tl.log_forward_pass(model, x, save_function_args=True)
    assert validate_module.validate_history(h, [model(x)])
    assert not validate_module.validate_history(h, [model(x) + 1], verbose=True)
    assert "output_1_3 differs from the output of a plain run" in capsys.readouterr().out


class _WritesIntoInput(nn.Module):
    def forward(self, x):
        x.add_(1)  # the model changes what it is given
        return x * 2


def test_inputs_are_used_once_by_log_forward_pass_with_labels():
    """layers_to_save with positions needs a first pass: it gets a copy of the inputs."""
    x = torch.zeros(3)
    h = tl.log_forward_pass(_WritesIntoInput(), x, layers_to_save=[-2])
    assert torch.equal(x, torch.ones(3))  # as after one plain forward
    assert torch.equal(h[h.layer_labels[0]].activation, torch.full((3,), 2.0))


def test_inputs_are_used_once_by_validation():
    x = torch.zeros(3)
    assert tl.validate_model_activations(_WritesIntoInput(), x, random_seed=0, verbose=True)
    assert torch.equal(x, torch.ones(3))


def test_inputs_that_cannot_be_deep_copied_fall_back_to_copying_tensors():
    import threading

    class Holder:
        def __init__(self, x):
            self.x, self.lock = x, threading.Lock()  # a lock cannot be deep-copied

    class UsesHolder(nn.Module):
        def forward(self, x, holder):
            return x * 2

    h = tl.log_forward_pass(UsesHolder(), [torch.rand(3), Holder(torch.rand(3))], layers_to_save=[-2])
    assert any("could not be deep-copied" in note for note in h.notes)


def test_a_non_leaf_input_is_copied():
    w = torch.rand(3, requires_grad=True)
    x = w * 2  # not a leaf: deepcopy refuses it, a clone keeps its graph
    model = nn.Sequential(nn.Linear(3, 2))
    assert tl.validate_model_activations(model, x, random_seed=0, verbose=True)
    h = tl.log_forward_pass(model, x, layers_to_save=[-2])
    assert h.notes == []


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))

    def cache():
        with torch.no_grad():
            past = model(ids, use_cache=True).past_key_values
        assert isinstance(past, transformers.DynamicCache) and past.get_seq_length() == 8
        return past

    return model, torch.randint(0, 100, (1, 1)), cache


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers renames past_key_values
def test_a_dynamic_cache_grows_once():
    """The label-resolving first pass and validation's plain run each get their own copy of the
    cache: the user's cache holds 8 + 1 tokens afterwards, as after one plain forward."""
    model, new_token, cache = _tiny_gpt2()
    past = cache()
    h = tl.log_forward_pass(model, [new_token], {"past_key_values": past, "use_cache": True}, layers_to_save=[-2])
    assert past.get_seq_length() == 9
    assert len(h) == 1
    past = cache()
    assert tl.validate_model_activations(
        model, [new_token], {"past_key_values": past, "use_cache": True}, random_seed=0, verbose=True
    )
    assert past.get_seq_length() == 9


def test_unequal_compares_bits_and_reads_a_device_once(monkeypatch):
    import torchlens.trace.verdicts as verdicts

    a = torch.tensor([1.0, float("nan"), -0.0])
    pairs = [
        (a, a.clone()),  # a NaN left as it was: unchanged
        (torch.ones(3), torch.ones(3)),
        (torch.ones(3), torch.tensor([1.0, 1.0, 2.0])),
        (torch.tensor([0.0]), torch.tensor([-0.0])),  # equal values, other bits: changed
        (torch.arange(4), torch.arange(4)),
        (torch.ones(2, 2), torch.ones(4)),  # another shape
        (torch.zeros(0), torch.zeros(0)),
        (torch.tensor([True, False, True]), torch.tensor([True, True, True])),  # 3 bytes
        (torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)),  # 6 bytes
        (torch.ones(2, 3).t(), torch.ones(2, 3).t()),  # not contiguous: compared by value
        (torch.ones(4, dtype=torch.complex64), torch.ones(4, dtype=torch.complex64) * 1j),
    ]

    def bits(t):
        return (t.shape, t.contiguous().view(-1).view(torch.uint8).tolist())

    expected = [i for i, (x, y) in enumerate(pairs) if bits(x) != bits(y)]
    assert expected == [2, 3, 5, 7, 10]
    assert verdicts.unequal(pairs) == expected
    monkeypatch.setattr(verdicts, "READ_AT_ONCE", frozenset({"meta"}))  # the CPU plays a GPU
    reads = []
    real_stack = torch.stack
    monkeypatch.setattr(verdicts.torch, "stack", lambda ts: reads.append(len(ts)) or real_stack(ts))
    assert verdicts.unequal(pairs) == expected
    assert reads == [9]  # every answer but the other shape's and the transposed pair's, read together


@pytest.mark.parametrize("as_on_a_gpu", [False, True])
def test_a_model_writing_its_parameters_unseen_is_left_as_found(monkeypatch, as_on_a_gpu):
    """Validation restores a parameter the forward changes through ``.data`` (no version
    counter sees it), and leaves the others untouched (their versions do not move)."""
    import torchlens.trace.verdicts as verdicts

    if as_on_a_gpu:
        monkeypatch.setattr(verdicts, "READ_AT_ONCE", frozenset({"meta"}))

    class Drifting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            self.b.bias.data.add_(1.0)
            return self.b(self.a(x).relu())

    model = Drifting()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    versions = {n: p._version for n, p in model.named_parameters()}
    tl.validate_model_activations(model, torch.rand(2, 3))
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
        assert (p._version == versions[name]) is (name != "b.bias"), name
