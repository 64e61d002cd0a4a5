"""The legacy tensor method ``x.new(...)`` in a forward: traced like ``torch.Tensor(2, 3)`` and
its kin (tests/test_coverage.py), and a pass that uses it validates (issue 42, item 9)."""

import torch
from torch import nn

import torchlens as tl
from torchlens.trace.validate import validate_history


class NewThenFill(nn.Module):
    """``x.new(sizes)`` allocates uninitialised memory of x's dtype and device, then ``fill_``."""

    def forward(self, x):
        y = x.new(3).fill_(1)
        z = x.new(torch.Size([2, 3])).fill_(2.0)
        w = x.new([1.0, 2.0, 3.0])  # from data: a value a replay must reproduce
        return x * y + z + w


def test_new_with_sizes_is_traced_and_validates():
    x = torch.randn(2, 3)
    h = tl.log_forward_pass(NewThenFill(), x, random_seed=0)
    assert h.untraced_layers == []
    made = [e for e in h if e.func_name == "new"]
    assert [tuple(e.shape) for e in made] == [(3,), (2, 3), (3,)]
    assert [h[c].func_name for e in made[:2] for c in e.child_layers] == ["fill_", "fill_"]
    torch.testing.assert_close(h[h.output_layers[0]].activation, x * 1 + 2 + torch.tensor([1.0, 2.0, 3.0]))
    assert tl.validate_model_activations(NewThenFill(), x, random_seed=0, verbose=True) is True


def test_new_from_data_is_still_compared(tmp_path):
    h = tl.log_forward_pass(NewThenFill(), torch.randn(2, 3), random_seed=0, save_function_args=True)
    assert validate_history(h, verbose=True) is True
    from_data = [e for e in h if e.func_name == "new"][2]
    from_data.activation = from_data.activation + 1  # a wrong value is noticed: data is compared
    assert validate_history(h) is False
