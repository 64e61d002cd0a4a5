"""``tl.log_generate``: HuggingFace's own ``generate`` runs with every forward call traced.

Tokens must be those of a plain ``generate`` with the same arguments and seed (greedy and
sampled, GPT-2 and LLaMA, with and without a cache, dynamic and static caches); the steps hold
the real values (the logits ``generate`` itself returns); steps whose structure is reused agree
with fully traced ones; a user's own loop over ``past_key_values`` traced with
``log_forward_pass`` gives the same labels; ``save_to=`` and ``save``/``load``; the step slider
of the graph page in Chromium; bad input."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import torchlens as tl
from torchlens.trace.generate import GenerateHistory, StepStructureError

transformers = pytest.importorskip("transformers")

from tiny_llms import MODELS  # noqa: E402
from tiny_llms import gpt2 as _gpt2  # noqa: E402
from tiny_llms import llama as _llama  # noqa: E402

PROMPT = torch.tensor([[1, 2, 3]])


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def _options(**extra):
    return dict(max_new_tokens=6, min_new_tokens=6, pad_token_id=0, **extra)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, model.training, vars(model).get("forward")


# ----- tokens as a plain generate ---------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        dict(do_sample=False),
        dict(do_sample=True, top_k=10, temperature=1.5),
        dict(do_sample=False, use_cache=False),
        dict(do_sample=True, use_cache=False),
        dict(do_sample=False, cache_implementation="static"),
        dict(do_sample=True, cache_implementation="static"),
    ],
    ids=["greedy", "sampled", "greedy-nocache", "sampled-nocache", "greedy-static", "sampled-static"],
)
def test_tokens_equal_plain_generate(model, extra):
    torch.manual_seed(11)
    plain = model.generate(PROMPT, **_options(**extra))
    before = _state(model)
    torch.manual_seed(11)
    gen = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(**extra))
    assert torch.equal(gen.tokens, plain)
    assert torch.equal(gen.new_tokens, plain[:, PROMPT.shape[1] :])
    assert len(gen.steps) == 6 and len(gen) == 6
    after = _state(model)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0]) and before[1:] == after[1:]
    # the generator continues as after a plain generate: the next draw is the same
    torch.manual_seed(11)
    model.generate(PROMPT, **_options(**extra))
    expected = torch.rand(3)
    torch.manual_seed(11)
    tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(**extra))
    assert torch.equal(torch.rand(3), expected)


def test_generate_calls_forward_as_without_torchlens(model):
    """generate reads forward's signature (logits_to_keep=1 in the prefill where supported): the
    calls it makes under log_generate have the same arguments as in a plain generate."""
    seen = []

    def note(module, args, kwargs):
        seen.append(
            (len(args), {k: (tuple(v.shape) if torch.is_tensor(v) else v) for k, v in kwargs.items() if k != "cache"})
        )

    handle = model.register_forward_pre_hook(note, with_kwargs=True)
    try:
        model.generate(PROMPT, **_options(do_sample=False))
        plain, seen[:] = list(seen), []
        gen = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(do_sample=False))
    finally:
        handle.remove()
    assert seen == plain
    kept = 1 if plain[0][1].get("logits_to_keep") == 1 else PROMPT.shape[1]  # positions the prefill scores
    assert gen[0]["lm_head"].activation.shape[1] == kept


@pytest.mark.parametrize("reuse", [True, False], ids=["reused", "traced"])
def test_steps_hold_the_logits_generate_used(model, reuse):
    """gen[i]['lm_head'] at the last position is the score row generate chose token i from."""
    gen = tl.log_generate(
        model,
        PROMPT,
        layers_to_save=["lm_head"],
        reuse_structure=reuse,
        **_options(do_sample=False, return_dict_in_generate=True, output_logits=True),
    )
    assert len(gen.output.logits) == len(gen.steps)
    for i, logits in enumerate(gen.output.logits):
        assert torch.equal(gen[i]["lm_head"].activation[:, -1, :], logits)
    assert gen[3]["lm_head"].activation.shape[1] == 1
    assert torch.equal(gen.layer("lm_head", steps=slice(1, None))[:, 0, -1], torch.cat(gen.output.logits[1:]))


def test_reused_steps_match_fully_traced_steps(model):
    torch.manual_seed(5)
    fast = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(do_sample=True))
    torch.manual_seed(5)
    full = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], reuse_structure=False, **_options(do_sample=True))
    assert torch.equal(fast.tokens, full.tokens)
    for a, b in zip(fast.steps, full.steps):
        assert a.layer_labels == b.layer_labels
        for ea, eb in zip(a, b):
            assert (ea.shape, ea.dtype, ea.parent_layers, ea.containing_modules) == (
                eb.shape,
                eb.dtype,
                eb.parent_layers,
                eb.containing_modules,
            )
            assert torch.equal(ea.activation, eb.activation)
    assert any("reuse_structure=False" in note for note in fast[2].notes)
    assert not any("reuse_structure=False" in note for note in full[2].notes)


def test_metadata_of_every_op_per_step(model):
    gen = tl.log_generate(model, PROMPT, layers_to_save=None, **_options(do_sample=False))
    for history in gen.steps:
        assert len(history) > 50 and all(e.activation is None for e in history)
    assert gen[1].layer_labels == gen[5].layer_labels  # decode steps share one structure
    kv_shapes = [[e.shape for e in h if e.layer_type == "cat"] for h in gen.steps[1:]]
    assert kv_shapes[0] != kv_shapes[-1]  # but the cache grows: each step has its own shapes


def test_user_loop_gives_the_same_labels(model):
    """A loop over the cache traced with log_forward_pass per step: the labels of log_generate's steps."""
    gen = tl.log_generate(model, PROMPT, layers_to_save=None, **_options(do_sample=False))
    cache = transformers.DynamicCache(config=model.config)
    ids, seen = PROMPT, 0
    for i in range(len(gen.steps)):
        positions = torch.arange(seen, seen + ids.shape[1]).unsqueeze(0)  # what generate passes too
        call = dict(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        history = tl.log_forward_pass(model, [], call, layers_to_save=None)
        assert history.layer_labels == gen[i].layer_labels, f"step {i}"
        seen += ids.shape[1]
        ids = gen.tokens[:, PROMPT.shape[1] + i : PROMPT.shape[1] + i + 1]
    assert cache.get_seq_length() == PROMPT.shape[1] + len(gen.steps) - 1


def test_label_keys_are_resolved_on_each_structure():
    model = _llama()
    probe = tl.log_generate(model, PROMPT, layers_to_save=None, **_options(do_sample=False))
    label = next(e.label for e in probe[1] if e.layer_type == "linear")
    gen = tl.log_generate(model, PROMPT, layers_to_save=[label], **_options(do_sample=False))
    assert [h.layer_labels for h in gen.steps[1:]] == [[label]] * 5
    assert gen.layer(label, steps=slice(1, None)).shape[0] == 5
    with pytest.raises(ValueError, match="no_such_layer"):
        tl.log_generate(model, PROMPT, layers_to_save=["no_such_layer_1_1"], **_options(do_sample=False))


def test_a_step_that_runs_other_modules_is_not_given_a_reused_structure():
    model = _llama()
    calls = {"n": 0}
    original = type(model.model.layers[1]).forward

    class SkipLater(type(model.model.layers[1])):
        def forward(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] >= 3:  # from the second decode step on, the block's MLP is skipped
                self.mlp, saved = torch.nn.Identity(), self.mlp
                try:
                    return original(self, *args, **kwargs)
                finally:
                    self.mlp = saved
            return original(self, *args, **kwargs)

    model.model.layers[1].__class__ = SkipLater
    with pytest.raises(StepStructureError, match="reuse_structure=False"):
        tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(do_sample=False))
    assert "forward" not in vars(model)


def test_encoder_decoder_and_beam_search():
    """T5: the decoder's first call fills the cross-attention cache, the later ones reuse it, so
    they are two structures (told apart by the cache being empty); beam search: one pass per step."""
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, decoder_start_token_id=0, pad_token_id=0
    )
    t5 = transformers.T5ForConditionalGeneration(config).eval()
    options = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    gen = tl.log_generate(t5, PROMPT, layers_to_save=["lm_head"], **options)
    assert torch.equal(gen.tokens, t5.generate(PROMPT, **options))
    assert gen.prompt_length == 1 and gen.new_tokens.shape == (1, 4)  # after the decoder start token
    assert gen.layer("lm_head").shape == (4, 1, 1, 50)
    model = _gpt2()
    beams = dict(max_new_tokens=4, min_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0)
    gen = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **beams)
    assert torch.equal(gen.tokens, model.generate(PROMPT, **beams))
    assert gen[1]["lm_head"].activation.shape[0] == 2  # one row per beam


@pytest.mark.slow  # compiling takes ~15 s here
def test_compiled_submodule_is_traced_eagerly():
    """A torch.compile'd block runs its Python code in the traced steps: the same labels as uncompiled."""
    model = _gpt2()
    options = _options(do_sample=False)
    plain = tl.log_generate(model, PROMPT, layers_to_save=None, **options)
    model.transformer.h[0].mlp = torch.compile(model.transformer.h[0].mlp)
    compiled = tl.log_generate(model, PROMPT, layers_to_save=None, **options)
    assert torch.equal(compiled.tokens, plain.tokens)
    assert [h.layer_labels for h in compiled.steps] == [h.layer_labels for h in plain.steps]


def test_layer_over_steps_stacks_or_concatenates():
    """Prefill positions then one per step along the sequence (without logits_to_keep), or stacked."""
    model = _gpt2()
    gen = tl.log_generate(model, PROMPT, layers_to_save=["transformer.ln_f"], **_options(do_sample=False))
    assert gen[0]["transformer.ln_f"].activation.shape[1] == PROMPT.shape[1]  # the prefill sees the whole prompt
    assert gen.layer("transformer.ln_f").shape == (1, PROMPT.shape[1] + 5, 32)
    assert gen.layer("transformer.ln_f", steps=slice(1, None)).shape == (5, 1, 1, 32)
    with pytest.raises(ValueError, match="no saved activation at step"):
        gen.layer("lm_head")


def test_a_forward_wrapper_of_the_users_own_is_kept():
    """A model whose forward is already wrapped (accelerate's hooks do this): the wrapper runs once
    per step and is back in place afterwards."""
    model = _llama()
    inner, ran = model.forward, []

    def own(*args, **kwargs):
        ran.append(1)
        return inner(*args, **kwargs)

    functools.update_wrapper(own, inner)
    model.forward = own
    try:
        plain = model.generate(PROMPT, **_options(do_sample=False))
        ran.clear()
        gen = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(do_sample=False))
        assert torch.equal(gen.tokens, plain) and len(ran) == len(gen.steps)
        assert vars(model)["forward"] is own
    finally:
        del model.forward


# ----- save_to, save and load ---------------------------------------------------------------------
def test_save_to_streams_each_step_and_loads_back(tmp_path):
    model = _gpt2()
    folder = str(tmp_path / "gen")
    torch.manual_seed(2)
    gen = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], save_to=folder, **_options(do_sample=True))
    torch.manual_seed(2)
    memory = tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(do_sample=True))
    assert torch.equal(gen.tokens, memory.tokens)
    assert sorted(os.listdir(folder)) == ["generate.json"] + [f"step_{i:04d}" for i in range(6)]
    again = GenerateHistory.load(folder)
    assert torch.equal(again.tokens, memory.tokens) and again.prompt_length == PROMPT.shape[1]
    for a, b in zip(again.steps, memory.steps):
        assert a.layer_labels == b.layer_labels
        assert torch.equal(a["lm_head"].activation, b["lm_head"].activation)
    saved = memory.save(str(tmp_path / "copy"))
    assert torch.equal(GenerateHistory.load(saved).layer("lm_head"), memory.layer("lm_head"))
    with pytest.raises(FileExistsError):
        tl.log_generate(model, PROMPT, save_to=folder, **_options(do_sample=False))
    with pytest.raises(ValueError, match="generate.json"):
        GenerateHistory.load(str(tmp_path))


# ----- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    model = _gpt2()
    with pytest.raises(TypeError, match="generate") as caught:
        tl.log_generate(torch.nn.Linear(2, 2), PROMPT, max_new_tokens=3)
    assert isinstance(caught.value, tl.TorchlensError)
    for bad in (None, 0, -1, 2.5):
        with pytest.raises(ValueError, match="max_new_tokens") as caught:
            tl.log_generate(model, PROMPT, max_new_tokens=bad)
        assert isinstance(caught.value, tl.TorchlensError)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tl.log_generate(model, PROMPT)
    with torch.device("meta"):
        meta_model = transformers.GPT2LMHeadModel(model.config)
    with pytest.raises(ValueError, match="meta.*cpu") as caught:
        tl.log_generate(meta_model, PROMPT, max_new_tokens=2)
    assert isinstance(caught.value, tl.TorchlensError)
    with pytest.raises(ValueError, match="cpu.*meta"):
        tl.log_generate(model, PROMPT.to("meta"), max_new_tokens=2)
    with pytest.raises(tl.MetaDeviceError):
        tl.log_generate(meta_model, PROMPT.to("meta"), max_new_tokens=2)
    with pytest.raises(TypeError, match="step number"):
        tl.log_generate(model, PROMPT, layers_to_save=["lm_head"], **_options(do_sample=False))["lm_head"]
    assert "forward" not in vars(model)


# ----- the page with its step slider -----------------------------------------------------------------
def test_step_slider_in_chromium(browser, tmp_path):
    model = _gpt2()
    gen = tl.log_generate(model, PROMPT, **_options(do_sample=False))
    path = str(tmp_path / "gen.html")
    gen.to_html(path)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    errors = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("file://" + path)
        page.wait_for_selector('body[data-ready="1"]')
        assert page.get_attribute("body", "data-step") == "1"
        page.click('[data-role="expand-all"]')
        # a node of the attention's key/value concatenation: its shape grows with the step
        label = next(e.label for e in gen[1] if e.layer_type == "cat")
        node = f'[data-label="{label}"]'

        def node_text():
            return page.text_content(node)

        shapes = {}
        for step in (1, 3, 5):
            page.eval_on_selector(
                '[data-role="step"]', f"(s) => {{ s.value = '{step}'; s.dispatchEvent(new Event('input')); }}"
            )
            assert page.get_attribute("body", "data-step") == str(step)
            shapes[step] = node_text()
            expected = "×".join(map(str, gen[step][label].shape))
            assert expected in shapes[step], (step, shapes[step], expected)
            assert f"decode {step}" in page.text_content('[data-role="step-label"]')
        assert len(set(shapes.values())) == 3
        page.click(node)  # the details panel follows the slider
        page.eval_on_selector('[data-role="step"]', "(s) => { s.value = '2'; s.dispatchEvent(new Event('input')); }")
        assert "×".join(map(str, gen[2][label].shape)) in page.text_content('[data-role="details"]').replace(", ", "×")
        assert not errors
    finally:
        context.close()


# ----- attention across steps, and keys that name nothing (issue 42) ----------------------------
def test_decompose_sdpa_gives_the_attention_of_every_step():
    """decompose=("sdpa",) is log_generate's own option (not handed to generate): every step's
    attention runs as its math; the tokens are a plain generate's."""
    model = _gpt2()
    options = _options(do_sample=False)
    plain = model.generate(PROMPT, **options)
    gen = tl.log_generate(model, PROMPT, layers_to_save=None, decompose=("sdpa",), **options)
    assert torch.equal(gen.tokens, plain)
    assert not any("recorded leanly" in n for n in gen.notes)  # every step traced: each has its attention
    saved = tl.log_generate(model, PROMPT, layers_to_save=["attnsoftmax"], decompose="sdpa", **options)
    probs = saved.attention("transformer.h.1.attn")
    prompt = PROMPT.shape[1]
    assert [tuple(p.shape) for p in probs] == [(1, 2, prompt, prompt)] + [(1, 2, 1, prompt + i) for i in range(1, 6)]
    for p in probs:
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    assert torch.equal(probs[0].triu(1), torch.zeros_like(probs[0]))  # causal in the prefill
    assert [len([e for e in step if e.layer_type == "attnsoftmax"]) for step in gen] == [2] * 6
    with pytest.raises(tl.TorchlensError, match="decompose: unknown name"):
        tl.log_generate(model, PROMPT, decompose=("flash",), **options)


def test_layer_of_a_module_the_model_does_not_have_says_so():
    model = _gpt2()  # 2 blocks
    gen = tl.log_generate(model, PROMPT, **_options(do_sample=False))
    with pytest.raises(KeyError, match=r"'transformer.h.9' is not a layer label, module address.*Did you mean"):
        gen.layer("transformer.h.9")
    assert gen.layer("transformer.ln_f").shape == (1, PROMPT.shape[1] + 5, 32)  # a module it has
