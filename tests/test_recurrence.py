"""Recurrence detection: which operations are passes of one layer, with exact labels."""

import pytest
import torch
from torch import nn

import torchlens as tl
from examples.models import SimpleRecurrent as SpecRecurrent


class NestedLoops(nn.Module):
    def forward(self, x):
        for _ in range(2):
            for _ in range(3):
                x = x + 1
            x = x * 2
        return x


class Interleaved(nn.Module):
    """Two weighted modules called in the order A B A A B."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        for name in "abaab":
            x = getattr(self, name)(x)
        return x


class WeightFreeLoop(nn.Module):
    def forward(self, x):
        for _ in range(3):
            x = torch.sin(x)
            x = x * 2
        return x


class EvenOdd(nn.Module):
    def forward(self, x):
        for i in range(4):
            if i % 2 == 0:
                x = x + 1
            else:
                x = x * 2
        return x


class FakeLoop(nn.Module):
    """ReLU after every conv, written out: the same type at unrelated places."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 1)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        return x


class ModuleListStack(nn.Module):
    """A Python loop over different convs: a stack of distinct layers, not a recurrence."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(1, 1, 1) for _ in range(3))

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x))
        return x


class ActivationBeforeEachConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(1, 1, 1) for _ in range(3))

    def forward(self, x):
        for conv in self.convs:
            x = conv(torch.tanh(x))
        return x


class ParallelLookAlike(nn.Module):
    def forward(self, x):
        a = x * 2
        a = a.sin()
        b = x * 2
        b = b.sin()
        return a + b


class RNNCell10(nn.Module):
    """An RNN cell unrolled over 10 time steps in Python."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4 + 6, 6)

    def forward(self, seq):
        h = torch.zeros(seq.shape[0], 6)
        for t in range(seq.shape[1]):
            h = torch.tanh(self.fc(torch.cat([seq[:, t], h], dim=1)))
        return h


class FusedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)

    def forward(self, x):
        out, _ = self.lstm(x)
        return out


class RandomWhile(nn.Module):
    """A while loop whose number of iterations comes from a random draw."""

    def forward(self, x):
        steps = int(torch.randint(2, 6, (1,)))
        while steps > 0:
            x = x * 0.5
            steps -= 1
        return x


class ReusedInAndOut(nn.Module):
    """A parameter-free module used once outside a loop and again inside it."""

    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        x = self.act(x)
        for _ in range(2):
            x = self.act(self.fc(x))
        return x


class TiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        z = self.fc(x * 2)
        return y + z


class HelperCalledTwice(nn.Module):
    """The same helper function called from two lines: two layers, not passes."""

    def forward(self, x):
        x = self.helper(x)
        x = self.helper(x)
        return x

    @staticmethod
    def helper(t):
        return t.exp()


class TwoOpsOneLine(nn.Module):
    def forward(self, x):
        for _ in range(2):
            x = x + 1
            x = x + 1  # noqa: E702  (two call sites on one line)
        return x


class LoopInSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = WeightFreeLoop()

    def forward(self, x):
        return self.inner(x) + 1


class InitThenLoop(nn.Module):
    """A weighted layer before the loop: the first iteration's anchor lies outside the loop."""

    def __init__(self):
        super().__init__()
        self.init = nn.Linear(3, 3)
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.init(x)
        for _ in range(3):
            h = self.fc(h * 0.5)
        return h


class ComprehensionBranches(nn.Module):
    def forward(self, x):
        parts = [x * k for k in range(3)]
        return torch.stack(parts).sum(0)


class SharedCellTwoLoops(nn.Module):
    """The same cell in two consecutive loops: one weighted layer with 4 passes."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(2, 2)

    def forward(self, x):
        for _ in range(2):
            x = self.cell(x)
        y = x
        for _ in range(2):
            y = self.cell(y)
        return y


class UniversalStack(nn.Module):
    """A stack of two different layers applied three times."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))

    def forward(self, x):
        for _ in range(3):
            for layer in self.layers:
                x = torch.relu(layer(x))
        return x


class WeightedBlockTwice(nn.Module):
    """A weighted block called from two lines: its parameter-free internals are passes too."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())

    def forward(self, x):
        x = self.block(x)
        x = self.block(x)
        return x


def _p(label, n):
    return [f"{label}:{i}" for i in range(1, n + 1)]


CASES = [
    (
        SpecRecurrent,
        (torch.rand(6, 5),),
        ["input_1_0"]
        + [x for i in range(1, 5) for x in (f"linear_1_1:{i}", f"add_1_2:{i}", f"mul_1_3:{i}")]
        + ["output_1_4"],
    ),
    (
        NestedLoops,
        (torch.rand(2),),
        [
            "input_1_0",
            "add_1_1:1",
            "add_1_1:2",
            "add_1_1:3",
            "mul_1_2:1",
            "add_1_1:4",
            "add_1_1:5",
            "add_1_1:6",
            "mul_1_2:2",
            "output_1_3",
        ],
    ),
    (
        Interleaved,
        (torch.rand(1, 3),),
        ["input_1_0", "linear_1_1:1", "linear_2_2:1", "linear_1_1:2", "linear_1_1:3", "linear_2_2:2", "output_1_3"],
    ),
    (
        WeightFreeLoop,
        (torch.rand(2),),
        ["input_1_0", "sin_1_1:1", "mul_1_2:1", "sin_1_1:2", "mul_1_2:2", "sin_1_1:3", "mul_1_2:3", "output_1_3"],
    ),
    (EvenOdd, (torch.rand(2),), ["input_1_0", "add_1_1:1", "mul_1_2:1", "add_1_1:2", "mul_1_2:2", "output_1_3"]),
    (
        FakeLoop,
        (torch.rand(1, 1, 2, 2),),
        ["input_1_0", "conv2d_1_1", "relu_1_2", "conv2d_2_3", "relu_2_4", "output_1_5"],
    ),
    (
        ModuleListStack,
        (torch.rand(1, 1, 2, 2),),
        ["input_1_0", "conv2d_1_1", "relu_1_2", "conv2d_2_3", "relu_2_4", "conv2d_3_5", "relu_3_6", "output_1_7"],
    ),
    (
        ActivationBeforeEachConv,
        (torch.rand(1, 1, 2, 2),),
        ["input_1_0", "tanh_1_1", "conv2d_1_2", "tanh_2_3", "conv2d_2_4", "tanh_3_5", "conv2d_3_6", "output_1_7"],
    ),
    (
        ParallelLookAlike,
        (torch.rand(2),),
        ["input_1_0", "mul_1_1", "sin_1_2", "mul_2_3", "sin_2_4", "add_1_5", "output_1_6"],
    ),
    (
        RNNCell10,
        (torch.rand(2, 10, 4),),
        ["input_1_0", "zeros_1_1"]
        + [x for i in range(1, 11) for x in (f"getitem_1_2:{i}", f"cat_1_3:{i}", f"linear_1_4:{i}", f"tanh_1_5:{i}")]
        + ["output_1_6"],
    ),
    (
        FusedLSTM,
        (torch.rand(2, 5, 3),),
        # one fused op with three outputs (out, h, c); h and c are unused dead ends, kept
        ["input_1_0", "zeros_1_1", "zeros_2_2", "lstm_1_3", "lstm_2_4", "lstm_3_5", "output_1_6"],
    ),
    (
        ReusedInAndOut,
        (torch.rand(1, 3),),
        ["input_1_0", "relu_1_1", "linear_1_2:1", "relu_2_3:1", "linear_1_2:2", "relu_2_3:2", "output_1_4"],
    ),
    (
        WeightedBlockTwice,
        (torch.rand(1, 3),),
        ["input_1_0", "linear_1_1:1", "tanh_1_2:1", "linear_1_1:2", "tanh_1_2:2", "output_1_3"],
    ),
    (
        TiedWeights,
        (torch.rand(1, 3),),
        ["input_1_0", "linear_1_1:1", "mul_1_2", "linear_1_1:2", "add_1_3", "output_1_4"],
    ),
    (HelperCalledTwice, (torch.rand(2),), ["input_1_0", "exp_1_1", "exp_2_2", "output_1_3"]),
    (TwoOpsOneLine, (torch.rand(2),), ["input_1_0", "add_1_1:1", "add_2_2:1", "add_1_1:2", "add_2_2:2", "output_1_3"]),
    (
        LoopInSubmodule,
        (torch.rand(2),),
        [
            "input_1_0",
            "sin_1_1:1",
            "mul_1_2:1",
            "sin_1_1:2",
            "mul_1_2:2",
            "sin_1_1:3",
            "mul_1_2:3",
            "add_1_3",
            "output_1_4",
        ],
    ),
    (
        InitThenLoop,
        (torch.rand(1, 3),),
        [
            "input_1_0",
            "linear_1_1",
            "mul_1_2:1",
            "linear_2_3:1",
            "mul_1_2:2",
            "linear_2_3:2",
            "mul_1_2:3",
            "linear_2_3:3",
            "output_1_4",
        ],
    ),
    (
        ComprehensionBranches,
        (torch.rand(2),),
        ["input_1_0", "mul_1_1:1", "mul_1_1:2", "mul_1_1:3", "stack_1_2", "sum_1_3", "output_1_4"],
    ),
    (SharedCellTwoLoops, (torch.rand(1, 2),), ["input_1_0"] + _p("linear_1_1", 4) + ["output_1_2"]),
    (
        UniversalStack,
        (torch.rand(1, 2),),
        ["input_1_0"]
        + [x for i in range(1, 4) for x in (f"linear_1_1:{i}", f"relu_1_2:{i}", f"linear_2_3:{i}", f"relu_2_4:{i}")]
        + ["output_1_5"],
    ),
]


@pytest.mark.parametrize("model_cls, inputs, labels", CASES, ids=[c[0].__name__ for c in CASES])
def test_exact_labels(model_cls, inputs, labels):
    torch.manual_seed(0)
    h = tl.log_forward_pass(model_cls(), list(inputs), random_seed=0)
    assert h.layer_labels == labels


def test_random_while_loop_is_one_layer_with_seeded_passes():
    counts = set()
    for seed in range(6):
        h = tl.log_forward_pass(RandomWhile(), torch.ones(2), random_seed=seed)
        torch.manual_seed(seed)
        steps = int(torch.randint(2, 6, (1,)))
        assert h.layer_labels == ["input_1_0"] + _p("mul_1_1", steps) + ["output_1_2"]
        counts.add(steps)
    assert len(counts) > 1  # the seed really changes the number of iterations


def test_every_key_form_finds_every_pass():
    h = tl.log_forward_pass(SpecRecurrent(), torch.rand(6, 5))
    for p in range(1, 5):
        entry = h[f"linear_1_1:{p}"]
        assert h[f"linear_1:{p}"] is entry and h[f"fc:{p}"] is entry
        assert h[f"add_1_2:{p}"].pass_num == p
        assert f"fc:{p}" in entry.lookup_keys
    with pytest.raises(KeyError, match=r"has 4 passes.*linear_1_1:1, linear_1_1:2, linear_1_1:3, linear_1_1:4"):
        h["linear_1_1"]
    with pytest.raises(KeyError, match="4 passes"):
        h["fc"]
    with pytest.raises(KeyError, match="4 passes"):
        h["add_1"]


def test_rolled_view_aggregates_passes():
    model = SpecRecurrent()
    x = torch.rand(6, 5)
    h = tl.log_forward_pass(model, x)
    rolled = h.rolled_layers
    assert list(rolled) == ["input_1_0", "linear_1_1", "add_1_2", "mul_1_3", "output_1_4"]
    linear = rolled["linear_1_1"]
    assert linear.num_passes == 4
    assert linear.parents_per_pass == {1: ["input_1_0"], 2: ["mul_1_3"], 3: ["mul_1_3"], 4: ["mul_1_3"]}
    assert linear.parent_layers == ["input_1_0", "mul_1_3"]
    assert rolled["mul_1_3"].children_per_pass[4] == ["output_1_4"]
    with torch.no_grad():
        expected = model.fc(x)
    assert torch.allclose(linear.activations[0], expected)
    assert h.layer_list_rolled[1] is linear


class Conditional(nn.Module):
    def forward(self, x):
        y = x * 2
        if y.mean() > 0:
            y = y + 1
        else:
            y = y - 1
        return y


def test_structure_flags_and_conditional_branching():
    h = tl.log_forward_pass(Conditional(), torch.ones(3))
    assert h.layer_labels == ["input_1_0", "mul_1_1", "mean_1_2", "gt_1_3", "add_1_4", "output_1_5"]
    assert h.conditional_layers == ["gt_1_3"]
    assert h["add_1_4"].branch_condition == "gt_1_3"
    assert "Starts a branch chosen by: gt_1_3" in str(h["add_1_4"])
    assert "purely feedforward, with branching, with conditional branching; 0 total modules." in str(h)
    recurrent = str(tl.log_forward_pass(SpecRecurrent(), torch.rand(6, 5)))
    assert "Model structure: recurrent (at most 4 loops), without branching; 1 total modules." in recurrent
    assert not tl.log_forward_pass(FakeLoop(), torch.rand(1, 1, 2, 2)).is_recurrent
