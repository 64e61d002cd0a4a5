"""Activation patching (tl.patch, tl.patch_sweep) against a reference computed by hand with
forward hooks on a tiny GPT-2 with random weights: the same numbers, cell by cell."""

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchlensError

transformers = pytest.importorskip("transformers")


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _with_first(out, new):
    return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new


@pytest.fixture(scope="module")
def gpt2():
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=4, n_positions=32, vocab_size=64, attn_implementation="eager"
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    clean_ids = torch.randint(0, 64, (1, 7))
    corrupt_ids = clean_ids.clone()
    corrupt_ids[0, 2] = (clean_ids[0, 2] + 5) % 64
    return model, clean_ids, corrupt_ids


def logit_diff(out):
    return out.logits[0, -1, 3] - out.logits[0, -1, 9]


def _hooked(model, ids, patches):
    """Metric of ``model(ids)`` with ``patches``: {module: function(output tensor) -> new tensor}."""
    handles = [
        module.register_forward_hook(lambda m, i, o, fn=fn: _with_first(o, fn(_first(o))))
        for module, fn in patches.items()
    ]
    try:
        with torch.no_grad():
            return logit_diff(model(ids)).item()
    finally:
        for h in handles:
            h.remove()


def _outputs_of(model, ids, modules):
    """Each module's (first) output in a plain run, captured with hooks."""
    found = {}
    handles = [
        module.register_forward_hook(lambda m, i, o, name=name: found.__setitem__(name, _first(o).clone()))
        for name, module in modules.items()
    ]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return found


def _replace_positions(clean_value, positions, heads=None, n_heads=1):
    def fn(value):
        new = value.clone()
        if heads is None:
            new[:, positions] = clean_value[:, positions]
        else:
            size = value.shape[-1] // n_heads
            for h in heads:
                cols = slice(h * size, (h + 1) * size)
                new[:, positions, cols] = clean_value[:, positions, cols]
        return new

    return fn


def test_sweep_every_block_at_every_position_matches_hooks(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    clean = tl.log_forward_pass(model, clean_ids)
    grid = tl.patch_sweep(model, corrupt_ids, source=clean, metric=logit_diff)
    blocks = {f"transformer.h.{i}": model.transformer.h[i] for i in range(3)}
    assert grid.dims == ("layer", "position") and grid.coords["layer"] == list(blocks)
    assert grid.coords["position"] == list(range(7)) and grid.shape == (3, 7)
    clean_values = _outputs_of(model, clean_ids, blocks)
    expected = np.array(
        [
            [_hooked(model, corrupt_ids, {module: _replace_positions(clean_values[name], [p])}) for p in range(7)]
            for name, module in blocks.items()
        ]
    )
    np.testing.assert_allclose(grid.values, expected, rtol=0, atol=1e-6)
    assert grid.modes["replay"] == 21 and grid.modes["model run"] == 0
    assert grid.corrupt == pytest.approx(_hooked(model, corrupt_ids, {}), abs=1e-6)
    with torch.no_grad():
        assert grid.clean == pytest.approx(logit_diff(model(clean_ids)).item(), abs=1e-6)
    # before the changed token nothing moves; the last block at the last position carries it all
    assert np.all(grid.values[:, :2] == grid.corrupt)
    assert grid.recovered()[-1, -1] == pytest.approx(1.0, abs=1e-5)
    frame = grid.to_pandas()
    assert list(frame.index) == list(blocks) and frame.loc["transformer.h.1", 4] == grid.sel(
        layer="transformer.h.1", position=4
    )


def test_heads_and_positions_of_attention_match_hooks(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    clean = tl.log_forward_pass(model, clean_ids)
    attn = model.transformer.h[1].attn
    res = tl.patch(
        model, corrupt_ids, source=clean, at="transformer.h.1.attn", heads=[1, 3], positions=[2, 5], metric=logit_diff
    )
    clean_attn = _outputs_of(model, clean_ids, {"a": attn})["a"]
    expected = _hooked(model, corrupt_ids, {attn: _replace_positions(clean_attn, [2, 5], heads=[1, 3], n_heads=4)})
    assert res.value == pytest.approx(expected, abs=1e-6) and res.mode == "replay"
    assert res.value != pytest.approx(res.corrupt, abs=1e-7)  # the patch did something
    grid = tl.patch_sweep(
        model,
        corrupt_ids,
        source=clean,
        metric=logit_diff,
        over=["transformer.h.1.attn"],
        heads="each",
        positions=[2, 5],
    )
    assert grid.dims == ("layer", "head", "position") and grid.shape == (1, 4, 2)
    one = _hooked(model, corrupt_ids, {attn: _replace_positions(clean_attn, [5], heads=[2], n_heads=4)})
    assert grid.sel(layer="transformer.h.1.attn", head=2, position=5) == pytest.approx(one, abs=1e-6)
    assert list(grid.to_pandas().index)[:2] == [("transformer.h.1.attn", 0), ("transformer.h.1.attn", 1)]


def test_a_module_and_a_label_patched_together_as_in_the_issue(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    clean = tl.log_forward_pass(model, clean_ids)
    label = clean["transformer.h.2"].label  # the block's output, named by its label
    res = tl.patch(
        model, corrupt_ids, source=clean, at=["transformer.h.0.attn", label], positions=slice(5, 6), metric=logit_diff
    )
    assert set(res.patched) == {clean["transformer.h.0.attn:1.0"].label, label}
    mods = {"a": model.transformer.h[0].attn, "b": model.transformer.h[2]}
    clean_values = _outputs_of(model, clean_ids, mods)
    expected = _hooked(model, corrupt_ids, {m: _replace_positions(clean_values[k], [5]) for k, m in mods.items()})
    assert res.value == pytest.approx(expected, abs=1e-6)
    whole = tl.patch(model, corrupt_ids, source=clean, at=label, metric=logit_diff)
    with torch.no_grad():
        assert whole.value == pytest.approx(logit_diff(model(clean_ids)).item(), abs=1e-6)
    assert whole.recovered == pytest.approx(1.0, abs=1e-5)


def test_runs_of_different_lengths_match_by_module_and_position(gpt2):
    model, clean_ids, _ = gpt2
    longer = torch.cat([clean_ids, clean_ids[:, :3]], dim=1)  # 10 tokens against 7
    source = tl.log_forward_pass(model, longer)
    block = model.transformer.h[1]
    res = tl.patch(
        model, clean_ids, source=source, at="transformer.h.1", positions=[6], source_positions=[9], metric=logit_diff
    )
    long_value = _outputs_of(model, longer, {"b": block})["b"]

    def take(value):
        new = value.clone()
        new[:, 6] = long_value[:, 9]
        return new

    assert res.value == pytest.approx(_hooked(model, clean_ids, {block: take}), abs=1e-6)
    with torch.no_grad():  # the metric of the source's own output, whatever its length
        assert res.clean == pytest.approx(logit_diff(model(longer)).item(), abs=1e-6)
    with pytest.raises(tl.PatchError, match="different lengths along dimension 1; give positions="):
        tl.patch(model, clean_ids, source=source, at="transformer.h.1", metric=logit_diff)
    with pytest.raises(
        tl.PatchError, match=r"source_positions 12 does not exist in .* of the source run \(it has 10\)"
    ):
        tl.patch(
            model,
            clean_ids,
            source=source,
            at="transformer.h.1",
            positions=[6],
            source_positions=[12],
            metric=logit_diff,
        )
    short = tl.log_forward_pass(model, clean_ids)  # patching the longer run from the shorter one
    with pytest.raises(tl.PatchError, match="position 8 of .* does not exist in the source run"):
        tl.patch(model, longer, source=short, at="transformer.h.1", positions=[8], metric=logit_diff)


def test_bad_input_is_a_clear_error(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    clean = tl.log_forward_pass(model, clean_ids)
    small = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=64, attn_implementation="eager"
        )
    ).eval()
    small_run = tl.log_forward_pass(small, clean_ids)
    with pytest.raises(tl.PatchError, match="the source run has no module transformer.h.2") as error:
        tl.patch(model, corrupt_ids, source=small_run, at="transformer.h.2", metric=logit_diff)
    assert isinstance(error.value, TorchlensError) and isinstance(error.value, ValueError)
    with pytest.raises(tl.PatchError, match="names no layer of the run patched"):
        tl.patch(model, corrupt_ids, source=clean, at="transformer.h.7", metric=logit_diff)
    wide = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=3, n_embd=16, n_head=4, n_positions=32, vocab_size=64, attn_implementation="eager"
        )
    ).eval()
    with pytest.raises(tl.PatchError, match=r"shape \(1, 7, 32\) in the run patched but \(1, 7, 16\)"):
        tl.patch(
            model, corrupt_ids, source=tl.log_forward_pass(wide, clean_ids), at="transformer.h.0", metric=logit_diff
        )
    weight = model.lm_head.weight
    with pytest.raises(tl.PatchError, match="metric returned a tensor that requires grad"):
        tl.patch(
            model,
            corrupt_ids,
            source=clean,
            at="transformer.h.0",
            metric=lambda out: out.logits[0, 0, 0] * weight[0, 0],
        )
    with pytest.raises(tl.PatchError, match=r"metric returned a tensor of shape \(1, 7, 64\)"):
        tl.patch(model, corrupt_ids, source=clean, at="transformer.h.0", metric=lambda out: out.logits)
    with pytest.raises(tl.PatchError, match="metric returned str"):
        tl.patch_sweep(model, corrupt_ids, source=clean, metric=lambda out: "big")
    with pytest.raises(tl.PatchError, match="positions 9 does not exist"):
        tl.patch(model, corrupt_ids, source=clean, at="transformer.h.0", positions=9, metric=logit_diff)
    with pytest.raises(tl.PatchError, match="source must be the ModelHistory"):
        tl.patch(model, corrupt_ids, source=clean_ids, at="transformer.h.0", metric=logit_diff)


def test_model_and_torch_as_before(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    model.transformer.h[0].ln_1.weight.requires_grad_(False)
    try:
        state = {k: v.clone() for k, v in model.state_dict().items()}
        functions = (torch.matmul, torch.Tensor.add, nn.functional.linear, nn.functional.layer_norm)
        clean = tl.log_forward_pass(model, clean_ids)
        rng = torch.get_rng_state()
        tl.patch_sweep(model, corrupt_ids, source=clean, metric=logit_diff, positions=[2])
        tl.patch(model, corrupt_ids, source=clean, at="transformer.h.1", metric=logit_diff, replay=False)
        assert torch.equal(torch.get_rng_state(), rng)
        assert (torch.matmul, torch.Tensor.add, nn.functional.linear, nn.functional.layer_norm) == functions
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
        assert not model.training and not model.transformer.h[0].ln_1.weight.requires_grad
        assert model.transformer.h[0].ln_2.weight.requires_grad and torch.is_grad_enabled()
    finally:
        model.transformer.h[0].ln_1.weight.requires_grad_(True)


class _Scripted(nn.Module):
    """A TorchScript part: torchlens cannot see inside it, so the graph cannot be replayed past it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)
        with pytest.warns(FutureWarning):  # torch.jit.script is deprecated, and still what this needs
            self.s = torch.jit.script(nn.Linear(4, 4))

    def forward(self, x):
        return self.b(torch.relu(self.s(self.a(x))))


def test_a_graph_that_cannot_be_replayed_runs_the_model_and_agrees_with_hooks():
    model = _Scripted()
    clean_x, corrupt_x = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    clean = tl.log_forward_pass(model, clean_x)
    res = tl.patch(model, corrupt_x, source=clean, at="a", positions=1, metric=lambda out: out[0, -1, 0])
    assert res.mode == "model run"
    a_clean = _outputs_of(model, clean_x, {"a": model.a})["a"]
    handle = model.a.register_forward_hook(lambda m, i, o: _replace_positions(a_clean, [1])(o))
    with torch.no_grad():
        expected = model(corrupt_x)[0, -1, 0].item()
    handle.remove()
    assert res.value == pytest.approx(expected, abs=1e-6)


class _ThroughNumpy(nn.Module):
    """Half of its value leaves torch and comes back: a dependency the trace cannot see."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.a(x)
        hidden = torch.tensor(h.detach().numpy() * 2.0)
        return self.b(h + hidden)


def test_sweep_checks_one_cell_against_the_model():
    model = _ThroughNumpy()
    clean = tl.log_forward_pass(model, torch.randn(1, 3, 4))
    with pytest.raises(tl.PatchError, match="gives another output when the ops downstream are re-run"):
        tl.patch_sweep(model, torch.randn(1, 3, 4), source=clean, over=["a"], metric=lambda out: out.sum())
    grid = tl.patch_sweep(
        model, torch.randn(1, 3, 4), source=clean, over=["a"], metric=lambda out: out.sum(), replay=False
    )
    assert grid.modes == {"replay": 0, "model run": 3}


def test_effects_painted_on_the_graph_page_and_the_heat_map(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    clean = tl.log_forward_pass(model, clean_ids)
    grid = tl.patch_sweep(model, corrupt_ids, source=clean, metric=logit_diff, positions=[2, 6])
    overlay = grid.overlay()
    assert set(overlay["values"]) == set(grid.labels) and overlay["scale"] == "diverging"
    strongest = grid.labels[int(np.abs(grid.effect()).max(axis=1).argmax())]
    assert abs(overlay["values"][strongest]) == pytest.approx(np.abs(grid.effect()).max())
    page = grid.to_html()
    assert "patching effect" in page and all(label in page for label in grid.labels)
    svg = grid.heatmap_svg()
    assert svg.startswith("<svg") and svg.count("<rect") >= 1 + 3 * 2 and "transformer.h.2" in svg
    res = tl.patch(model, corrupt_ids, source=clean, at="transformer.h.1", positions=2, metric=logit_diff)
    changed = res.changed
    block_out = res.history["transformer.h.1"].label
    assert block_out in changed and changed[block_out] > 0
    assert all(res.history[label].operation_num >= res.history[block_out].operation_num for label in changed)
    assert "change from the patch" in res.to_html()


def test_over_modules_needs_a_numbered_stack():
    model = nn.Sequential()
    model.add_module("first", nn.Linear(2, 2))
    model.add_module("second", nn.Linear(2, 2))
    clean = tl.log_forward_pass(model, torch.ones(1, 3, 2))
    with pytest.raises(tl.PatchError, match="over='modules' patches the blocks of a numbered stack"):
        tl.patch_sweep(model, torch.zeros(1, 3, 2), source=clean, metric=lambda out: out.sum())
    grid = tl.patch_sweep(model, torch.zeros(1, 3, 2), source=clean, metric=lambda out: out.sum(), over=["first"])
    assert grid.shape == (1, 3)


def test_sweep_over_heads_patches_the_input_of_the_output_projection_like_a_pre_hook(gpt2):
    model, clean_ids, corrupt_ids = gpt2
    clean = tl.log_forward_pass(model, clean_ids)
    grid = tl.patch_sweep(model, corrupt_ids, source=clean, metric=logit_diff, over="heads", positions=[2, 4, 6])
    assert grid.coords["layer"] == [f"transformer.h.{i}.attn.c_proj@input" for i in range(3)]
    assert grid.dims == ("layer", "head", "position") and grid.shape == (3, 4, 3)
    projections = [model.transformer.h[i].attn.c_proj for i in range(3)]
    clean_inputs = {}
    handles = [
        p.register_forward_pre_hook(lambda m, args, i=i: clean_inputs.__setitem__(i, args[0].clone()))
        for i, p in enumerate(projections)
    ]
    with torch.no_grad():
        model(clean_ids)
    for h in handles:
        h.remove()
    for i, proj in enumerate(projections):
        for head in range(4):
            for j, position in enumerate([2, 4, 6]):
                fn = _replace_positions(clean_inputs[i], [position], heads=[head], n_heads=4)
                handle = proj.register_forward_pre_hook(lambda m, args, fn=fn: (fn(args[0]),) + tuple(args[1:]))
                with torch.no_grad():
                    expected = logit_diff(model(corrupt_ids)).item()
                handle.remove()
                assert grid.values[i, head, j] == pytest.approx(expected, abs=1e-6)
    res = tl.patch(
        model,
        corrupt_ids,
        source=clean,
        at="transformer.h.0.attn.c_proj@input",
        heads=0,
        positions=2,
        metric=logit_diff,
    )
    assert res.value == pytest.approx(grid.values[0, 0, 0], abs=1e-7)
    with pytest.raises(tl.PatchError, match="the run patched has no module transformer.h.9"):
        tl.patch(model, corrupt_ids, source=clean, at="transformer.h.9@input", metric=logit_diff)


class _Recurrent(nn.Module):
    """One cell applied once per time step: runs of different lengths have different passes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.inp, self.cell, self.head = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def steps(self, x):
        h, states = torch.zeros(x.shape[0], 4), []
        for t in range(x.shape[1]):
            h = torch.tanh(self.cell(h) + self.inp(x[:, t]))
            states.append(h)
        return states

    def forward(self, x):
        return self.head(self.steps(x)[-1])


def test_labels_of_runs_of_different_lengths_match_the_same_op_of_the_same_module():
    model = _Recurrent()
    long_x, short_x = torch.randn(1, 5, 3), torch.randn(1, 3, 3)
    source = tl.log_forward_pass(model, long_x)
    head = tl.log_forward_pass(model, short_x)["head"].label
    res = tl.patch(model, short_x, source=source, at=head, metric=lambda out: out.sum())
    assert res.patched == {head: source["head"].label}  # not the cell's 4th linear, which follows the same tanh
    with torch.no_grad():
        assert res.value == pytest.approx(model(long_x).sum().item(), abs=1e-6) and res.value == res.clean
    tanh_2 = [e.label for e in source if e.layer_type == "tanh"][1]  # the state after step 2
    res = tl.patch(model, short_x, source=source, at=tanh_2, metric=lambda out: out.sum())
    with torch.no_grad():
        h = model.steps(long_x)[1]  # the long run's state after step 2, then the short run's step 3
        expected = model.head(torch.tanh(model.cell(h) + model.inp(short_x[:, 2]))).sum().item()
    assert res.patched == {tanh_2: tanh_2} and res.value == pytest.approx(expected, abs=1e-6)
    with pytest.raises(tl.PatchError, match="module cell ran 3 time"):
        tl.patch(model, long_x, source=tl.log_forward_pass(model, short_x), at="cell:5", metric=lambda out: out.sum())
