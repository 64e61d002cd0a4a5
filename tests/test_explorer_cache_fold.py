"""The explorer's view of a HuggingFace model folds the cache's tensors into one node, as the
graph page does (issue 42: the root view laid out every ``cache.layers.N.keys`` in one row, so
its text shrank to ~5 px at 1366x768)."""

from __future__ import annotations

import http.client
import json

import pytest
import torch

import torchlens as tl
from torchlens.train.serve import explore
from torchlens.train.serve.layout import io_groups

transformers = pytest.importorskip("transformers")


def _root_layout(tmp_path, name: str, n_layer: int, use_cache: bool) -> dict:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=50, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.tensor([[1, 2, 3, 4]])
    with tl.watch(model, run_dir=str(tmp_path / name), backend=None, verbose=False):
        model(ids, labels=ids, use_cache=use_cache).loss.backward()
    server = explore(str(tmp_path / name), port=0, block=False)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/api/layout?call=")
        response = conn.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        server.close()


def test_the_cache_of_a_gpt2_is_one_node_of_the_root_view(tmp_path):
    cached = _root_layout(tmp_path, "cached", n_layer=6, use_cache=True)
    ids = [n["id"] for n in cached["nodes"]]
    assert "output cache" in ids and not any(i.startswith("output cache.") for i in ids)
    folded = next(n for n in cached["nodes"] if n["id"] == "output cache")
    assert folded["label"] == "output cache (12 tensors)" and folded["kind"] == "output"
    assert [m[0] for m in folded["members"][:2]] == ["output cache.layers.0.keys", "output cache.layers.0.values"]
    assert ("transformer:1", "output cache") in {(e["from"], e["to"]) for e in cached["edges"]}
    plain = _root_layout(tmp_path, "plain", n_layer=6, use_cache=False)
    assert cached["width"] <= plain["width"] + folded["w"] + 40  # one more box in the row, not 12


def test_which_inputs_and_outputs_fold():
    assert io_groups(["output 0", "output 1"]) == {}  # an LSTM's (h_n, c_n): two nodes
    assert io_groups(["input 0", "input attention_mask"]) == {}  # forward's own arguments
    many = [f"output {i}" for i in range(9)]
    assert set(io_groups(many).values()) == {"output"}  # more than 8 tensors of one output tuple
    past = ["input past_key_values.layers.0.keys", "input past_key_values.layers.0.values"]
    assert set(io_groups(["input 0"] + past).values()) == {"input past_key_values"}
