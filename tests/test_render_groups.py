"""Many inputs/outputs of one container (a HuggingFace cache, a long tuple) are one node in the
graphviz drawing and one container that opens on the graph page (torchlens/trace/render/groups.py)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.render import build_dot
from torchlens.trace.render.graph_page.data import page_data


@pytest.fixture(scope="module")
def gpt2_cache():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    return tl.log_forward_pass(model, torch.randint(0, 100, (1, 8)), input_kwargs={"use_cache": True}, random_seed=0)


def _cache_outputs(h):
    return [e for e in h if e.is_output and e.address != "output.logits"]


def test_a_cache_is_one_node_in_the_drawing(gpt2_cache):
    cache = _cache_outputs(gpt2_cache)
    assert len(cache) == 4 and all(e.address.count(".") >= 3 for e in cache)  # layers.i.keys/values
    container = cache[0].address.rsplit(".", 3)[0]  # 'output.cache' (the name depends on transformers)
    source = build_dot(gpt2_cache).source
    assert f"{container} (4 tensors)" in source
    assert all(f"\t{e.label} " not in source for e in cache)  # no node of its own
    node = f'"group.{container}"'
    assert sorted(line.split(" -> ")[0].strip() for line in source.splitlines() if f"-> {node}" in line) == sorted(
        e.parent_layers[0] for e in cache
    )
    assert "\toutput_1_104 [" in source  # the logits stay a node
    rolled = build_dot(gpt2_cache, vis_mode="rolled").source
    assert f"{container} (4 tensors)" in rolled


def test_a_cache_is_one_closed_container_on_the_graph_page(gpt2_cache):
    cache = _cache_outputs(gpt2_cache)
    container = cache[0].address.rsplit(".", 3)[0]
    data = page_data(gpt2_cache)
    labels = [op["label"] for op in data["ops"]]
    for mode in ("unrolled", "rolled"):
        view = data["views"][mode]
        groups = {cid: m for cid, m in view["modules"].items() if m.get("group")}
        assert list(groups) == [f"[{container}]"]
        group = groups[f"[{container}]"]
        assert group["group"] == "output" and group["address"] == container and group["type"] == "4 tensors"
        assert group["parent"] == "" and ["m", f"[{container}]"] in view["modules"][""]["items"]
        members = [view["nodes"][n]["label"] for _, n in group["items"]]
        assert members == [e.label for e in cache]
        assert labels.index(members[0]) > 0


class Outputs(nn.Module):
    def __init__(self, n: int, nested: bool = False) -> None:
        super().__init__()
        self.n, self.nested = n, nested

    def forward(self, x):
        y = x + 1
        many = [(y * i, y - i) for i in range(self.n)] if self.nested else [y * i for i in range(self.n)]
        return y, many


@pytest.mark.parametrize(
    "n, nested, grouped",
    [(9, False, 9), (8, False, 0), (1, True, 2), (2, False, 0)],
)
def test_which_containers_are_grouped(n, nested, grouped):
    h = tl.log_forward_pass(Outputs(n, nested), torch.ones(2), random_seed=0)
    source = build_dot(h).source
    if grouped:
        assert f"output.1 ({grouped} tensors)" in source
        assert "output.0" in source and "output.0 (" not in source  # the main output stays alone
    else:
        assert "tensors)" not in source
        assert all(f"\t{label} [" in source for label in h.output_layers)


def test_an_lstm_state_pair_is_not_grouped():
    h = tl.log_forward_pass(nn.LSTM(3, 4, batch_first=True), torch.rand(1, 2, 3), random_seed=0)
    assert "tensors)" not in build_dot(h).source
    assert not any(m.get("group") for m in page_data(h)["views"]["unrolled"]["modules"].values())


def test_a_cache_passed_in_is_one_input_node():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 100, (1, 8)), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    h = tl.log_forward_pass(
        model, torch.randint(0, 100, (1, 1)), input_kwargs={name: cache, "use_cache": True}, random_seed=0
    )
    inputs = [e for e in h if e.is_input and e.address.startswith(f"input.{name}.")]
    assert len(inputs) == 4
    source = build_dot(h).source
    assert f"input.{name} (4 tensors)" in source and "\tinput_1_0 [" in source  # the token ids stay a node
    heads = {
        line.split(" -> ")[1].split(" [")[0].strip()
        for line in source.splitlines()
        if f'"group.input.{name}" ->' in line
    }
    assert heads == {c for e in inputs for c in e.child_layers}  # each past key/value feeds its cat
    groups = [m for m in page_data(h)["views"]["unrolled"]["modules"].values() if m.get("group") == "input"]
    assert [(g["address"], g["type"]) for g in groups] == [(f"input.{name}", "4 tensors")]
