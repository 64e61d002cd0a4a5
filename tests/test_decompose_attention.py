"""log_forward_pass(decompose=("sdpa",)): fused attention run as its math, its probabilities as ops."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.trace.capture import decorate

# the documented tolerance (README: Attention patterns), per dtype: (atol, rtol)
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 2**-6)}
DECOMPOSED_TYPES = {"swapaxes", "matmul", "mul", "ones", "tril", "logicalnot", "maskedfill", "add", "attnsoftmax"}
DECOMPOSED_TYPES |= {"float", "repeatinterleave", "to", "dropout"}


class Attention(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.options)


class Block(nn.Module):
    """Projections around an attention call, the call in a submodule of its own."""

    def __init__(self, dim=16, heads=4, **options):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn = Attention(**options)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.out(self.attn(q, k, v, mask).transpose(1, 2).reshape(b, t, d))


def _qkv(dtype, kv_heads=4, seq=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, seq, 16, generator=g)
    k, v = (torch.randn(2, kv_heads, seq, 16, generator=g) for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _padding(seq=12, kept=(12, 7)):
    """A [batch, 1, 1, keys] mask: the second sequence's last keys are padding."""
    keep = torch.zeros(len(kept), 1, 1, seq, dtype=torch.bool)
    for i, n in enumerate(kept):
        keep[i, ..., :n] = True
    return keep


def _decomposed(model, args, **kwargs):
    return tl.log_forward_pass(model, args, decompose=("sdpa",), random_seed=0, **kwargs)


def _output(history):
    return history[history.output_layers[0]].activation


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["causal", "bool padding", "float padding", "gqa", "no mask"])
def test_decomposed_equals_fused_within_the_documented_tolerance(dtype, case):
    options = {"is_causal": True} if case in ("causal", "gqa") else {}
    if case == "gqa":
        options["enable_gqa"] = True
    model = Attention(**options)
    q, k, v = _qkv(dtype, kv_heads=2 if case == "gqa" else 4)
    mask = None
    if "padding" in case:
        mask = _padding() if case == "bool padding" else torch.zeros(2, 1, 1, 12, dtype=dtype)
        if case == "float padding":
            mask = mask.masked_fill(~_padding(), float("-inf"))
    fused = model(q, k, v, mask)
    history = _decomposed(model, (q, k, v, mask))
    out = _output(history)
    atol, rtol = TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out, fused, atol=atol, rtol=rtol)
    probs = history.attention()
    assert probs.shape == (2, 4, 12, 12)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 12))
    if case in ("causal", "gqa"):
        assert not probs.triu(1).any()  # no query sees a later key
    if "padding" in case:
        assert not probs[1, ..., 7:].any() and probs[0, ..., 7:].all()  # padding keys get nothing
    assert "scaleddotproductattention" not in {e.layer_type for e in history}


def test_a_query_with_every_key_masked_gets_zeros_as_in_the_fused_kernel():
    q, k, v = _qkv(torch.float32)
    keep = torch.ones(2, 1, 12, 12, dtype=torch.bool)
    keep[:, :, 0] = False  # query 0 may attend to nothing
    model = Attention()
    fused = model(q, k, v, keep)
    history = _decomposed(model, (q, k, v, keep))
    torch.testing.assert_close(_output(history), fused, atol=1e-5, rtol=1e-5)
    probs = history.attention()
    assert not probs[:, :, 0].any() and not torch.isnan(_output(history)).any()
    torch.testing.assert_close(probs[:, :, 1:].sum(-1), torch.ones(2, 4, 11))


def test_seeded_dropout_draws_the_numbers_of_the_fused_kernel_on_the_cpu():
    model = Attention(dropout_p=0.3, is_causal=True)
    q, k, v = _qkv(torch.float32)
    torch.manual_seed(5)
    fused = model(q, k, v)
    history = tl.log_forward_pass(model, (q, k, v), decompose=("sdpa",), random_seed=5)
    torch.testing.assert_close(_output(history), fused, atol=1e-5, rtol=1e-5)
    dropped = history[[e.label for e in history if e.layer_type == "dropout"][0]].activation
    probs = history.attention()
    assert ((dropped == 0) | torch.isclose(dropped, probs / 0.7)).all()  # dropout after the probabilities
    torch.manual_seed(6)
    assert not torch.allclose(model(q, k, v), fused)  # the comparison above can fail


def test_without_the_option_the_call_is_one_fused_op_and_attention_says_what_to_pass():
    model, x = Block(is_causal=True), torch.randn(2, 12, 16)
    plain = tl.log_forward_pass(model, x, random_seed=0)
    assert [e.layer_type for e in plain].count("scaleddotproductattention") == 1
    assert "attnsoftmax" not in {e.layer_type for e in plain}
    with pytest.raises(tl.AttentionNotFoundError, match=r"decompose=\('sdpa',\)") as error:
        plain.attention("attn")
    assert "scaleddotproductattention_1" in str(error.value)
    decomposed = _decomposed(model, x)
    types = [e.layer_type for e in decomposed]
    assert types.count("attnsoftmax") == 1 and "scaleddotproductattention" not in types
    torch.testing.assert_close(_output(decomposed), _output(plain), atol=1e-5, rtol=1e-5)
    assert decomposed[[e.label for e in decomposed if e.layer_type == "attnsoftmax"][0]].containing_module == "attn"


def test_the_rest_of_the_history_has_the_same_structure():
    model, x = Block(is_causal=True), torch.randn(2, 12, 16)
    plain = tl.log_forward_pass(model, x, random_seed=0)
    decomposed = _decomposed(model, x)

    def outside(history):
        return [
            (e.layer_type, tuple(e.shape), e.containing_module, tuple(e.param_addresses))
            for e in history
            if e.layer_type not in DECOMPOSED_TYPES | {"scaleddotproductattention"}
        ]

    assert outside(decomposed) == outside(plain)
    assert decomposed.module_addresses == plain.module_addresses
    assert decomposed.module_passes == plain.module_passes
    sdpa = [e for e in plain if e.layer_type == "scaleddotproductattention"][0]
    weighted_sum = [e for e in decomposed if e.containing_module == "attn"][-1]
    assert weighted_sum.layer_type == "matmul"  # what the model goes on with
    assert [decomposed[c].layer_type for c in weighted_sum.child_layers] == [
        plain[c].layer_type for c in sdpa.child_layers
    ]


def test_validation_replays_every_decomposed_op():
    from torchlens.trace.validate import validate_history

    model, x = Block(is_causal=True), torch.randn(2, 12, 16)
    history = tl.log_forward_pass(model, x, decompose="sdpa", save_function_args=True, random_seed=0)
    assert validate_history(history)


def test_a_saved_and_loaded_decomposed_history_replays_every_op(tmp_path):
    from torchlens.trace.validate import validate_history

    model, x = Block(is_causal=True), torch.randn(2, 12, 16)
    history = tl.log_forward_pass(model, x, decompose="sdpa", save_function_args=True, random_seed=0)
    history.save(str(tmp_path / "run"))
    loaded = tl.load(str(tmp_path / "run"))
    assert torch.equal(loaded.attention("attn"), history.attention("attn"))
    assert validate_history(loaded)


def test_unknown_names_are_refused_with_the_valid_ones():
    with pytest.raises(tl.DecomposeError, match="'attention'.*Valid names: 'sdpa'") as error:
        tl.log_forward_pass(Block(), torch.randn(1, 3, 16), decompose=("attention",))
    assert isinstance(error.value, ValueError) and isinstance(error.value, tl.TorchlensError)


def test_attention_names_the_module_call():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block(is_causal=True)

        def forward(self, x):
            return self.block(self.block(x))

    model, x = Twice(), torch.randn(1, 6, 16)
    history = _decomposed(model, x)
    first, second = history.attention("block.attn:1"), history.attention("block.attn:2")
    assert first.shape == second.shape == (1, 4, 6, 6) and not torch.equal(first, second)
    torch.testing.assert_close(history.attention("block:2"), second)
    with pytest.raises(tl.AttentionNotFoundError, match="called 2 times.*'block.attn:1' to 'block.attn:2'"):
        history.attention("block.attn")
    with pytest.raises(tl.AttentionNotFoundError, match="'block.attn:3' names no call"):
        history.attention("block.attn:3")
    with pytest.raises(tl.AttentionNotFoundError, match="not the address.*Did you mean: block.attn"):
        history.attention("block.atn")
    with pytest.raises(tl.AttentionNotFoundError, match="no decomposed attention ran inside it"):
        history.attention("block.qkv:1")
    with pytest.raises(tl.AttentionNotFoundError, match="ran 2 attention calls"):
        history.attention()


def test_only_the_probabilities_can_be_saved():
    model, x = Block(is_causal=True), torch.randn(1, 6, 16)
    history = _decomposed(model, x, layers_to_save=["attnsoftmax"])
    assert history.attention("attn").shape == (1, 4, 6, 6)
    metadata = _decomposed(model, x, layers_to_save=None)
    with pytest.raises(tl.AttentionNotFoundError, match="not saved: include 'attnsoftmax'"):
        metadata.attention("attn")


def _torch_namespaces():
    owners = {id(p.owner): p.owner for p in decorate.wrapper_table().patches}
    return {key: dict(vars(owner)) for key, owner in owners.items()}


@pytest.mark.parametrize("training", [True, False])
def test_multihead_attention_fast_path_is_decomposed_and_torch_restored(training):
    mha = nn.MultiheadAttention(16, 4, batch_first=True, dropout=0.0).train(training)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        fused, _ = mha(x, x, x, need_weights=False)
    before = _torch_namespaces()
    state = {k: v.clone() for k, v in mha.state_dict().items()}
    with torch.no_grad():
        history = tl.log_forward_pass(mha, (x, x, x), {"need_weights": False}, decompose=("sdpa",))
    after = _torch_namespaces()
    assert all(after[k].keys() == v.keys() and all(after[k][n] is f for n, f in v.items()) for k, v in before.items())
    assert torch.backends.mha.get_fastpath_enabled() and decorate.ACTIVE.tracer is None
    assert mha.training is training and all(torch.equal(state[k], v) for k, v in mha.state_dict().items())
    torch.testing.assert_close(history[history.output_layers[0]].activation, fused, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(history.attention().sum(-1), torch.ones(2, 4, 6))


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x)[0]  # need_weights=True: it computes the weights itself, no sdpa call


def test_multihead_attention_computing_its_own_weights_is_named_in_the_error():
    history = tl.log_forward_pass(SelfAttention(), torch.randn(2, 6, 16), decompose=("sdpa",))
    softmax = [e.label for e in history if e.layer_type == "softmax"]
    assert len(softmax) == 1
    with pytest.raises(tl.AttentionNotFoundError, match=rf"with a softmax \({softmax[0]}\).*need_weights=False"):
        history.attention("mha")


def test_the_fast_path_switch_is_restored_when_the_model_raises():
    class Fails(nn.Module):
        def forward(self, q):
            F.scaled_dot_product_attention(q, q, q)
            raise ValueError("boom")

    before = _torch_namespaces()
    with pytest.raises(ValueError, match="boom"):
        tl.log_forward_pass(Fails(), torch.randn(1, 2, 3, 4), decompose=("sdpa",))
    assert torch.backends.mha.get_fastpath_enabled() and decorate.ACTIVE.tracer is None
    after = _torch_namespaces()
    assert all(all(after[k][n] is f for n, f in v.items()) for k, v in before.items())


@pytest.mark.parametrize("case", ["mask and is_causal", "heads without enable_gqa", "heads that do not divide"])
def test_calls_torch_refuses_raise_torchs_own_error(case):
    q, k, v = _qkv(torch.float32, kv_heads=4 if case == "mask and is_causal" else 3)
    if case == "mask and is_causal":
        model, args = Attention(is_causal=True), (q, k, v, _padding())
    else:
        model, args = Attention(enable_gqa=case == "heads that do not divide"), (q, k, v)
    with pytest.raises(RuntimeError) as plain:
        model(*args)
    with pytest.raises(RuntimeError) as traced:
        _decomposed(model, args)
    assert str(plain.value).splitlines()[0] == str(traced.value).splitlines()[0]


# ----- tiny Hugging Face models with random weights, attn_implementation="sdpa" -------------------


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=100, attn_implementation="sdpa", use_cache=False
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("build, attn", [(_gpt2, "transformer.h.{}.attn"), (_llama, "model.layers.{}.self_attn")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hugging_face_models_padded_batch(build, attn, dtype):
    model = build().to(dtype)
    ids = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0  # right padding of the second sequence
    kwargs = {"attention_mask": mask}
    with torch.no_grad():
        expected = model(ids, **kwargs).logits
    plain = tl.log_forward_pass(model, ids, kwargs, layers_to_save=None, random_seed=0)
    history = _decomposed(model, ids, input_kwargs=kwargs)
    logits = history["output.logits"].activation if "output.logits" in history else _output(history)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(logits, expected, atol=atol * 10, rtol=rtol * 4)  # through 2 blocks
    for layer in range(2):
        probs = history.attention(attn.format(layer))
        assert probs.shape == (2, 4, 10, 10)
        torch.testing.assert_close(probs.float().sum(-1), torch.ones(2, 4, 10))
        assert not probs.triu(1).any() and not probs[1, :, :, 7:].any()
    assert plain.module_addresses == history.module_addresses
    kinds = [e.layer_type for e in plain]
    assert kinds.count("scaleddotproductattention") == 2
    assert [e.layer_type for e in history].count("attnsoftmax") == 2


def test_gpt2_in_training_mode_draws_the_attention_dropout_of_the_fused_kernel():
    model = _gpt2().train()  # attention dropout 0.1 among the other dropouts
    ids = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    expected = model(ids).logits
    history = tl.log_forward_pass(model, ids, decompose=("sdpa",), random_seed=7)
    torch.testing.assert_close(history["output.logits"].activation, expected, atol=1e-5, rtol=1e-5)
    attention_dropout = [e for e in history if e.layer_type == "dropout" and e.containing_module.endswith(".attn")]
    assert len(attention_dropout) == 2 and model.training
    torch.manual_seed(8)
    assert not torch.allclose(model(ids).logits, expected)  # another seed, other draws: the check can fail


def test_a_meta_pass_decomposes_with_shapes_only():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, attn_implementation="sdpa",
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    history = tl.log_forward_pass(model, ids, decompose=("sdpa",), device="meta")
    probs = [e for e in history if e.layer_type == "attnsoftmax"]
    assert [e.shape for e in probs] == [torch.Size([1, 4, 8, 8])] * 2
    assert [e.containing_module for e in probs] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]


def test_the_probabilities_can_be_replaced_by_intervene_and_rerun():
    torch.manual_seed(0)
    model, x = Block(is_causal=True), torch.randn(1, 6, 16)
    history = _decomposed(model, x, save_function_args=True)
    label = [e.label for e in history if e.layer_type == "attnsoftmax"][0]
    causal = torch.ones(6, 6).tril()
    uniform = (causal / causal.sum(-1, keepdim=True)).expand(1, 4, 6, 6)
    intervened = _decomposed(model, x, intervene={label: lambda t, e: uniform})
    rerun = history.rerun({label: uniform})
    with torch.no_grad():  # by hand: the block with uniform causal attention
        q, k, v = model.qkv(x).view(1, 6, 3, 4, 4).permute(2, 0, 3, 1, 4)
        expected = model.out((uniform @ v).transpose(1, 2).reshape(1, 6, 16))
    torch.testing.assert_close(_output(intervened), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(_output(rerun), expected, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(_output(history), expected)
