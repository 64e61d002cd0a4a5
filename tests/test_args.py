"""Finding tensors in inputs and outputs (torchlens.trace.capture.args), cache objects included."""

import dataclasses
import inspect
import time

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.capture.args import tensors_in


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=8, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def test_past_keys_and_values_of_a_cache_are_input_layers():
    model = _tiny_gpt2()
    with torch.no_grad():
        cache = model(torch.randint(0, 50, (1, 4)), use_cache=True).past_key_values
    past_keys = cache.layers[0].keys
    # the argument's name changed across transformers versions
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    h = tl.log_forward_pass(model, [], {"input_ids": torch.randint(0, 50, (1, 1)), name: cache, "use_cache": True})
    addresses = [h[label].address for label in h.input_layers]
    assert addresses == ["input.input_ids"] + [
        f"input.{name}.layers.{i}.{kv}" for i in (0, 1) for kv in ("keys", "values")
    ]
    past = h[f"input.{name}.layers.0.keys"]
    assert torch.equal(past.activation, past_keys)
    cat = h[past.child_layers[0]]  # the past keys and the new token's keys, concatenated
    assert cat.layer_type == "cat" and cat.shape[-2] == 5
    assert cat.parent_layers[0] == past.label and h[cat.parent_layers[1]].layer_type != "input"
    assert not h.untraced_layers  # nothing of unknown origin is left
    # the updated cache is returned too: its tensors are outputs
    assert any(h[label].address.endswith("layers.1.values") for label in h.output_layers)


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: list


class Holder:
    def __init__(self, *tensors):
        self.tensors = list(tensors)
        self.me = self  # a cycle
        self.module = nn.Linear(2, 2)  # never entered: its parameters are not inputs
        self.param = nn.Parameter(torch.ones(2))


def test_objects_dataclasses_and_pytree_nodes_are_walked():
    x, y, z = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    found = tensors_in({"pair": Pair(x, [y]), "holder": Holder(z)})
    assert [(p, t) for p, t in found] == [(("pair", "a"), x), (("pair", "b", 0), y), (("holder", "tensors", 0), z)]

    class Node:
        def __init__(self, t):
            self.t = t

    torch.utils._pytree.register_pytree_node(Node, lambda n: ([n.t], None), lambda c, _: Node(c[0]))
    try:
        assert [p for p, _ in tensors_in([Node(x)])] == [(0, 0)]
    finally:
        torch.utils._pytree._deregister_pytree_node(Node)
    assert tensors_in(3) == [] and tensors_in("text") == [] and tensors_in(nn.Linear(2, 2)) == []


def test_the_walk_is_bounded():
    deep = x = torch.zeros(1)
    for _ in range(50):
        deep = [deep]
    assert tensors_in(deep) == []  # deeper than the limit: not searched
    wide = [object() for _ in range(200_000)] + [x]
    start = time.perf_counter()
    tensors_in(wide)
    assert time.perf_counter() - start < 1.0  # stops after a fixed number of values


def test_model_taking_an_object_input():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, state):
            return self.fc(state.tensors[0]) + state.param

    h = tl.log_forward_pass(Model(), [Holder(torch.rand(1, 2))])
    assert [h[label].address for label in h.input_layers] == ["input.state.tensors.0"]
    assert h["linear_1_1"].parent_layers == ["input_1_0"]
