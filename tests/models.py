"""A catalogue of small, tricky ``nn.Module``s for exercising torchlens.

Every class is a plain model (no test code). ``REGISTRY`` lists ``(name, model_factory,
example_inputs_factory)``: ``model_factory()`` builds a fresh model (seeded, so two calls give the
same weights) and ``example_inputs_factory()`` returns ``(args, kwargs)`` -- fresh, deterministic
tensors each call (some models mutate their inputs). A model class with an ``expected_error``
attribute raises that exception type from ``forward`` on purpose.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from models_paths import paths_registry

# Bound at import time, before any pass: torchlens must still trace these references.
from torch import nn, triu
from torch.nn.functional import gelu


# ----- plain structure -------------------------------------------------------------------------
class SimpleFeedforward(nn.Module):
    """Linear -> ReLU -> Linear: the baseline every other model is compared against."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 4)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class BranchMerge(nn.Module):
    """Two paths from the same input (linear+tanh and linear+sigmoid) added back together."""

    def __init__(self):
        super().__init__()
        self.left = nn.Linear(4, 4)
        self.right = nn.Linear(4, 4)

    def forward(self, x):
        a = torch.tanh(self.left(x))
        b = torch.sigmoid(self.right(x))
        return a + b


class SameTensorTwice(nn.Module):
    """``x + x``: one parent feeding both argument slots of one operation."""

    def forward(self, x):
        y = x * 3
        return y + y


class SquareViaMul(nn.Module):
    """``x * x`` and ``torch.mul(x, x)``: the same tensor as both arguments of two different
    multiplication entry points."""

    def forward(self, x):
        a = x * x
        b = torch.mul(x, x)
        return a - b + x


class TwoOpsOneTensor(nn.Module):
    """``sin(x) * cos(x)``: two different operations on one tensor, recombined."""

    def forward(self, x):
        return torch.sin(x) * torch.cos(x)


# ----- inputs ------------------------------------------------------------------------------------
class MultiInput(nn.Module):
    """Several positional tensor inputs combined in different ways."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x, y, z):
        return self.fc(x) * y - z


class NestedListInput(nn.Module):
    """``forward(pair)`` with ``pair = (a, [b, c])``: tensors nested in a tuple and a list."""

    def forward(self, pair):
        a, (b, c) = pair
        return a * b + c


class DictInput(nn.Module):
    """``forward(batch)`` with ``batch = {'feats': ..., 'bias': ...}``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, batch):
        return self.fc(batch["feats"]) + batch["bias"]


class KeywordMask(nn.Module):
    """A keyword tensor argument (``mask``) passed through ``input_kwargs``."""

    def forward(self, x, mask=None):
        y = x.exp()
        if mask is not None:
            y = y * mask
        return y.sum(dim=-1)


class MixedArgs(nn.Module):
    """Tensors mixed with a Python float and a string flag that selects the branch."""

    def forward(self, x, scale, mode):
        if mode == "double":
            x = x * 2
        return x * scale + 1.5


# ----- outputs ---------------------------------------------------------------------------------
class TupleOutput(nn.Module):
    """Returns a tuple of three tensors."""

    def forward(self, x):
        return x + 1, x * 2, x.sum()


class DictOutput(nn.Module):
    """Returns a dict of tensors (like a HuggingFace ``ModelOutput``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        logits = self.fc(x)
        return {"logits": logits, "probs": logits.softmax(-1)}


class NestedOutput(nn.Module):
    """Returns ``{'a': x, 'b': [y, (z,)]}``."""

    def forward(self, x):
        return {"a": x.neg(), "b": [x.abs(), (x.exp(),)]}


class SameTensorReturnedTwice(nn.Module):
    """The same tensor object returned in two output slots."""

    def forward(self, x):
        y = x.tanh()
        return y, y


# ----- buffers ---------------------------------------------------------------------------------
class BufferUse(nn.Module):
    """A registered buffer read in forward (it becomes a ``buffer`` layer when first used)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.arange(4, dtype=torch.float32))

    def forward(self, x):
        return x + self.offset


class BufferCounter(nn.Module):
    """Reassigns a buffer in forward (``self.count = self.count + 1``); the new value is also
    used in the output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count = self.count + 1
        return x * self.count


class RunningMeanInplace(nn.Module):
    """A running mean buffer updated in place from the input (``mul_``/``add_``), then used."""

    def __init__(self):
        super().__init__()
        self.register_buffer("running_mean", torch.tensor([1.0, -2.0, 3.0]))

    def forward(self, x):
        with torch.no_grad():
            self.running_mean.mul_(0.9).add_(0.1 * x.mean(0))
        return x - self.running_mean


# ----- in-place operations ---------------------------------------------------------------------
class InplaceReLUModule(nn.Module):
    """``nn.ReLU(inplace=True)`` after a linear layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.fc(x)) * 2


class InplaceOps(nn.Module):
    """``x += y``, ``relu_`` and ``add_`` on intermediate tensors."""

    def forward(self, x, y):
        a = x * 1
        a += y
        a.relu_()
        a.add_(1.0)
        return a


class SetItem(nn.Module):
    """``x[:, 0] = 0`` on an intermediate tensor, then a tensor-valued ``x[:, 1] = v``."""

    def forward(self, x):
        y = x + 1
        y[:, 0] = 0
        v = x[:, 2] * 10
        y[:, 1] = v
        return y


class SliceWriteClone(nn.Module):
    """Clone, then write a computed slice into part of the clone."""

    def forward(self, x):
        y = x.clone()
        y[:, 1:3] = x[:, :2] * 2
        return y


class MutatesInput(nn.Module):
    """Mutates its input tensor in place (``x.mul_(2)``) before using it."""

    def forward(self, x):
        x.mul_(2)
        return x + 1


# ----- tensors created in forward --------------------------------------------------------------
class CreatedInside(nn.Module):
    """Tensors created inside forward (``rand``, ``ones``, ``arange``, ``from_numpy``,
    ``tensor``) that feed the output, plus a ``torch.rand`` that is never used."""

    def forward(self, x):
        unused = torch.rand(7)  # noqa: F841 -- must be pruned
        noise = torch.rand(x.shape)
        ones = torch.ones(x.shape[-1])
        ramp = torch.arange(x.shape[-1], dtype=torch.float32)
        table = torch.from_numpy(np.linspace(0.0, 1.0, x.shape[-1], dtype=np.float32))
        k = torch.tensor(0.5)
        return x + noise * k + ones + ramp * table


class DeadEnd(nn.Module):
    """A computation from the input whose result is never used (kept by torchlens)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        unused = torch.exp(x).sum()  # noqa: F841
        return self.fc(x)


# ----- module reuse ----------------------------------------------------------------------------
class ModuleCalledTwice(nn.Module):
    """``self.fc(self.fc(x))``: one weighted module, two passes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.fc(x))


class TiedWeights(nn.Module):
    """An embedding whose weight is reused as an output projection via ``F.linear``."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)

    def forward(self, ids):
        h = self.emb(ids)
        h = torch.tanh(h)
        return F.linear(h, self.emb.weight)


class IdentityModel(nn.Module):
    """``nn.Identity`` in the middle of a model: it returns its input unchanged."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.skip = nn.Identity()

    def forward(self, x):
        return self.skip(self.fc(x)) + 1


class ReluAttribute(nn.Module):
    """Stores ``torch.relu`` as a module attribute and calls it through ``self.act``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = torch.relu

    def forward(self, x):
        return self.act(self.fc(x))


class FileLevelImport(nn.Module):
    """Calls ``triu`` and ``gelu`` imported into this file before the pass."""

    def forward(self, x):
        return gelu(triu(x))


# ----- properties ------------------------------------------------------------------------------
class TensorProperties(nn.Module):
    """``.T``, ``.mT``, ``.real`` of a complex tensor, and ``.data``."""

    def forward(self, x):
        a = x.T @ x  # (4, 4)
        b = x.mT.sum()
        c = torch.complex(x, x * 2).real
        d = x.data * 3
        return a.sum() + b + c.sum() + d.sum()


# ----- randomness ------------------------------------------------------------------------------
class DropoutTrain(nn.Module):
    """Dropout in train mode plus ``torch.randn_like``: output depends on the random seed."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x)) + torch.randn_like(x) * 0.01


# ----- recurrent layers ------------------------------------------------------------------------
class LSTMModel(nn.Module):
    """An ``nn.LSTM`` whose outputs (sequence and final states) are all used."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return out.sum(1) + h[0] + c[0]


class GRUModel(nn.Module):
    """An ``nn.GRU`` followed by a linear head on the last time step."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        out, h = self.gru(x)
        return self.head(out[:, -1])


# ----- errors ----------------------------------------------------------------------------------
class RaisesMidway(nn.Module):
    """Runs a few operations, then a shape-mismatched matmul raises ``RuntimeError``."""

    expected_error = RuntimeError

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.relu(self.fc(x))
        z = y + 1
        return z @ torch.ones(3, 2)  # (2, 4) @ (3, 2): shape error


# ----- module nesting --------------------------------------------------------------------------
class Leaf(nn.Module):
    """Innermost level of ``Nested3Levels``: linear + relu."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Middle(nn.Module):
    """Middle level of ``Nested3Levels``: wraps a ``Leaf`` and scales its output."""

    def __init__(self):
        super().__init__()
        self.leaf = Leaf()

    def forward(self, x):
        return self.leaf(x) * 2


class Nested3Levels(nn.Module):
    """Modules nested three levels deep: outer.middle.leaf.fc."""

    def __init__(self):
        super().__init__()
        self.middle = Middle()

    def forward(self, x):
        return self.middle(x) + 1


class SequentialModuleListLoop(nn.Module):
    """A Sequential stem followed by a Python loop over a ModuleList."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


class FunctionalOnly(nn.Module):
    """No submodules, no parameters: only functional calls."""

    def forward(self, x):
        y = F.softplus(x)
        y = F.normalize(y, dim=-1)
        return torch.clamp(y, 0.1, 0.9).log()


class LayerNormModel(nn.Module):
    """``F.layer_norm`` (a composite) and ``nn.LayerNorm``."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        y = F.layer_norm(x, (6,))
        return self.ln(y * 2)


class MHAModel(nn.Module):
    """``nn.MultiheadAttention`` self-attention (returns output and averaged weights)."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, weights = self.attn(x, x, x)
        return out, weights


class BatchNormModel(nn.Module):
    """``nn.BatchNorm1d``; the factory puts it in train or eval mode."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(x)


class ConvPoolFlatten(nn.Module):
    """Conv2d -> ReLU -> MaxPool2d -> flatten -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))
        return self.fc(torch.flatten(x, 1))


class MatmulEinsum(nn.Module):
    """``@``, ``torch.matmul``, ``torch.bmm`` and ``torch.einsum``."""

    def forward(self, a, b):
        x = a @ b
        y = torch.matmul(a, b)
        z = torch.einsum("bij,bjk->bik", a, b)
        w = torch.bmm(a, b)
        return x + y + z - w


class CatStack(nn.Module):
    """Multi-input operations: ``torch.cat`` and ``torch.stack`` of several tensors."""

    def forward(self, x, y):
        c = torch.cat([x, y * 2, x.exp()], dim=1)
        s = torch.stack((x, y), dim=0)
        return c.sum() + s.sum()


class SplitChunk(nn.Module):
    """Multi-output operations: ``torch.split`` and ``Tensor.chunk``."""

    def forward(self, x):
        a, b = torch.split(x, [2, 4], dim=1)
        c, d, e = x.chunk(3, dim=1)
        return a.sum(1) + b.sum(1) + c.prod(1) - d.sum(1) * e.sum(1)


class TensorIndexGetitem(nn.Module):
    """``x[idx]`` with a tensor index computed from the input (argsort)."""

    def forward(self, x):
        idx = x[:, 0].argsort()
        return x[idx] * 2


class MaskedFillFromInput(nn.Module):
    """``masked_fill`` with a boolean mask computed from the input."""

    def forward(self, x):
        mask = x < 0
        return x.masked_fill(mask, -1.0) * 3


class WhereModel(nn.Module):
    """``torch.where(cond, a, b)`` with all three computed from the input."""

    def forward(self, x):
        return torch.where(x > 0.5, x.sqrt(), -x)


class ViewReshapePermute(nn.Module):
    """``view``, ``reshape``, ``permute``, ``contiguous``, ``transpose``, ``flatten``."""

    def forward(self, x):  # x: (2, 3, 4)
        y = x.permute(0, 2, 1).contiguous()
        y = y.view(2, 12)
        y = y.reshape(2, 4, 3).transpose(1, 2)
        return y.flatten()


class ResidualBlock(nn.Module):
    """A ResNet-style basic block: conv-bn-relu-conv-bn plus the identity skip."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(3)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class DirectParameter(nn.Module):
    """A bare ``nn.Parameter`` used directly: ``x * self.scale + self.shift``."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        self.shift = nn.Parameter(torch.tensor([0.5]))

    def forward(self, x):
        return x * self.scale + self.shift


class ScalarLoss(nn.Module):
    """Returns a 0-d tensor: the MSE loss between a prediction and a target."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, target):
        return F.mse_loss(self.fc(x).squeeze(-1), target)


class IntBoolOps(nn.Module):
    """Integer and boolean tensors: ``argmax``, comparisons, logical ops, float conversion."""

    def forward(self, x):
        top = x.argmax(dim=1)
        pos = x > 0
        both = pos & (x < 1)
        count = both.sum(dim=1)
        return top + count, both.float().mean()


class LoopWeighted(nn.Module):
    """A Python loop applying the same weighted layer three times (one layer, three passes)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.cell(x))
        return x


class NoGradPart(nn.Module):
    """Part of forward runs under ``torch.no_grad()``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            stats = self.fc(x).mean()
        return self.fc(x) - stats


# ----- a few more tricky cases -----------------------------------------------------------------
class ConstantTensorAttribute(nn.Module):
    """A plain tensor attribute (neither parameter nor buffer) used in forward."""

    def __init__(self):
        super().__init__()
        self.table = torch.tensor([1.0, -1.0, 2.0])

    def forward(self, x):
        return x * self.table


class ParamlessLoop(nn.Module):
    """A loop of parameter-free operations: each one is its own layer."""

    def forward(self, x):
        for _ in range(3):
            x = x + 1
        return x


class BufferInSubmodule(nn.Module):
    """A buffer living inside a submodule (address ``norm.scale``)."""

    class Scaler(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((3,), 2.0))

        def forward(self, x):
            return x * self.scale

    def __init__(self):
        super().__init__()
        self.norm = BufferInSubmodule.Scaler()

    def forward(self, x):
        return self.norm(x).sum(-1)


class SharedLinearTwoBranches(nn.Module):
    """One linear module applied to two different inputs, then merged."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x, y):
        return self.proj(x) * self.proj(y)


class ComplexOps(nn.Module):
    """Complex tensors: ``view_as_complex``, ``abs``, ``angle`` and ``.imag``."""

    def forward(self, x):  # x: (..., 2)
        z = torch.view_as_complex(x.contiguous())
        return z.abs() + z.angle() + (z * z).imag


class KeywordTensorCall(nn.Module):
    """Tensors passed to torch functions as keyword arguments (``other=``, ``weight=``)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(3) * 2)

    def forward(self, x, y):
        s = torch.add(x, other=y, alpha=2)
        return F.linear(input=s, weight=self.weight)


class RaisesInSubmodule(nn.Module):
    """A submodule runs an operation and then raises a plain Python ``ValueError``."""

    expected_error = ValueError

    class Checker(nn.Module):
        def forward(self, x):
            y = x.abs()
            raise ValueError("Checker: refusing this input")

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.check = RaisesInSubmodule.Checker()

    def forward(self, x):
        return self.check(self.fc(x))


class PythonNumpyRandom(nn.Module):
    """Uses Python's ``random`` and ``numpy.random`` inside forward (seeded by ``random_seed``)."""

    def forward(self, x):
        noise = torch.from_numpy(np.random.rand(*x.shape).astype(np.float32))
        return x * random.random() + noise


class InplaceTorchFunction(nn.Module):
    """Calls the in-place function ``torch.relu_`` from the torch namespace (not the method)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        torch.relu_(y)
        return y * 2


class ParamTranspose(nn.Module):
    """A raw weight matrix transposed with ``.T`` and multiplied: ``x @ self.W.T``."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(2, 3))

    def forward(self, x):
        return x @ self.W.T


class ConditionalOnTensor(nn.Module):
    """Python control flow on a tensor value (``if x.sum() > 0``); the comparison is a dead end."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class InplaceThroughView(nn.Module):
    """An in-place operation on a view (``y[0].mul_(10)``) changes its base ``y``, which is used later."""

    def forward(self, x):
        y = x + 0
        row = y[0]
        row.mul_(10)
        return y * 1


# ----- registry --------------------------------------------------------------------------------
def _gen(seed: int = 1234) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int = 1234) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def _seeded(cls, *args, train=None, **kwargs) -> Callable[[], nn.Module]:
    def build():
        torch.manual_seed(0)
        model = cls(*args, **kwargs)
        if train is not None:
            model.train(train)
        return model

    build.__name__ = f"make_{cls.__name__}"
    return build


def _inputs(*args, **kwargs) -> Callable[[], Tuple[tuple, dict]]:
    """A factory that returns fresh copies of the given arguments each call."""

    def fresh(value):
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, (list, tuple)):
            return type(value)(fresh(v) for v in value)
        if isinstance(value, dict):
            return {k: fresh(v) for k, v in value.items()}
        return value

    def make():
        return tuple(fresh(a) for a in args), {k: fresh(v) for k, v in kwargs.items()}

    return make


REGISTRY: List[Tuple[str, Callable[[], nn.Module], Callable[[], Tuple[tuple, dict]]]] = [
    ("simple_feedforward", _seeded(SimpleFeedforward), _inputs(_randn(2, 5))),
    ("branch_merge", _seeded(BranchMerge), _inputs(_randn(2, 4))),
    ("same_tensor_twice", _seeded(SameTensorTwice), _inputs(_randn(2, 3))),
    ("square_via_mul", _seeded(SquareViaMul), _inputs(_randn(2, 3))),
    ("two_ops_one_tensor", _seeded(TwoOpsOneTensor), _inputs(_randn(2, 3))),
    ("multi_input", _seeded(MultiInput), _inputs(_randn(2, 3, seed=1), _randn(2, 3, seed=2), _randn(2, 3, seed=3))),
    (
        "nested_list_input",
        _seeded(NestedListInput),
        _inputs((_randn(2, 2, seed=1), [_randn(2, 2, seed=2), _randn(2, 2, seed=3)])),
    ),
    ("dict_input", _seeded(DictInput), _inputs({"feats": _randn(3, 4, seed=1), "bias": _randn(3, 2, seed=2)})),
    (
        "keyword_mask",
        _seeded(KeywordMask),
        _inputs(_randn(2, 4), mask=torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])),
    ),
    ("mixed_args", _seeded(MixedArgs), _inputs(_randn(2, 3), 0.25, "double")),
    ("tuple_output", _seeded(TupleOutput), _inputs(_randn(2, 3))),
    ("dict_output", _seeded(DictOutput), _inputs(_randn(2, 4))),
    ("nested_output", _seeded(NestedOutput), _inputs(_randn(2, 3))),
    ("same_tensor_returned_twice", _seeded(SameTensorReturnedTwice), _inputs(_randn(2, 3))),
    ("buffer_use", _seeded(BufferUse), _inputs(_randn(2, 4))),
    ("buffer_counter", _seeded(BufferCounter), _inputs(_randn(2, 3))),
    ("running_mean_inplace", _seeded(RunningMeanInplace), _inputs(_randn(4, 3))),
    ("inplace_relu_module", _seeded(InplaceReLUModule), _inputs(_randn(2, 4))),
    ("inplace_ops", _seeded(InplaceOps), _inputs(_randn(2, 3, seed=1), _randn(2, 3, seed=2))),
    ("setitem", _seeded(SetItem), _inputs(_randn(2, 3))),
    ("slice_write_clone", _seeded(SliceWriteClone), _inputs(_randn(2, 4))),
    ("mutates_input", _seeded(MutatesInput), _inputs(_randn(2, 3))),
    ("created_inside", _seeded(CreatedInside), _inputs(_randn(2, 4))),
    ("dead_end", _seeded(DeadEnd), _inputs(_randn(2, 4))),
    ("module_called_twice", _seeded(ModuleCalledTwice), _inputs(_randn(2, 4))),
    ("tied_weights", _seeded(TiedWeights), _inputs(torch.tensor([[1, 4, 7], [0, 9, 2]]))),
    ("identity", _seeded(IdentityModel), _inputs(_randn(2, 3))),
    ("relu_attribute", _seeded(ReluAttribute), _inputs(_randn(2, 4))),
    ("file_level_import", _seeded(FileLevelImport), _inputs(_randn(3, 3))),
    ("tensor_properties", _seeded(TensorProperties), _inputs(_randn(3, 4))),
    ("dropout_train", _seeded(DropoutTrain, train=True), _inputs(_randn(4, 8))),
    ("lstm", _seeded(LSTMModel), _inputs(_randn(2, 4, 3))),
    ("gru", _seeded(GRUModel), _inputs(_randn(2, 4, 3))),
    ("raises_midway", _seeded(RaisesMidway), _inputs(_randn(2, 4))),
    ("nested_3_levels", _seeded(Nested3Levels), _inputs(_randn(2, 4))),
    ("sequential_modulelist_loop", _seeded(SequentialModuleListLoop), _inputs(_randn(2, 4))),
    ("functional_only", _seeded(FunctionalOnly), _inputs(_randn(2, 5))),
    ("layer_norm", _seeded(LayerNormModel), _inputs(_randn(2, 3, 6))),
    ("multihead_attention", _seeded(MHAModel, train=False), _inputs(_randn(2, 5, 8))),
    ("batchnorm_train", _seeded(BatchNormModel, train=True), _inputs(_randn(6, 3))),
    ("batchnorm_eval", _seeded(BatchNormModel, train=False), _inputs(_randn(6, 3))),
    ("conv_pool_flatten", _seeded(ConvPoolFlatten), _inputs(_randn(2, 2, 4, 4))),
    ("matmul_einsum", _seeded(MatmulEinsum), _inputs(_randn(2, 3, 4, seed=1), _randn(2, 4, 5, seed=2))),
    ("cat_stack", _seeded(CatStack), _inputs(_randn(2, 3, seed=1), _randn(2, 3, seed=2))),
    ("split_chunk", _seeded(SplitChunk), _inputs(_randn(2, 6))),
    ("tensor_index_getitem", _seeded(TensorIndexGetitem), _inputs(_randn(4, 3))),
    ("masked_fill", _seeded(MaskedFillFromInput), _inputs(_randn(3, 4))),
    ("where", _seeded(WhereModel), _inputs(_randn(3, 4).abs())),
    ("view_reshape_permute", _seeded(ViewReshapePermute), _inputs(_randn(2, 3, 4))),
    ("residual_block", _seeded(ResidualBlock, train=False), _inputs(_randn(1, 3, 4, 4))),
    ("direct_parameter", _seeded(DirectParameter), _inputs(_randn(2, 3))),
    ("scalar_loss", _seeded(ScalarLoss), _inputs(_randn(5, 4, seed=1), _randn(5, seed=2))),
    ("int_bool_ops", _seeded(IntBoolOps), _inputs(_randn(3, 4))),
    ("loop_weighted", _seeded(LoopWeighted), _inputs(_randn(2, 4))),
    ("no_grad_part", _seeded(NoGradPart), _inputs(_randn(2, 4))),
    ("constant_tensor_attribute", _seeded(ConstantTensorAttribute), _inputs(_randn(2, 3))),
    ("paramless_loop", _seeded(ParamlessLoop), _inputs(_randn(2, 3))),
    ("buffer_in_submodule", _seeded(BufferInSubmodule), _inputs(_randn(2, 3))),
    (
        "shared_linear_two_branches",
        _seeded(SharedLinearTwoBranches),
        _inputs(_randn(2, 3, seed=1), _randn(2, 3, seed=2)),
    ),
    ("complex_ops", _seeded(ComplexOps), _inputs(_randn(2, 3, 2))),
    ("keyword_tensor_call", _seeded(KeywordTensorCall), _inputs(_randn(2, 3, seed=1), _randn(2, 3, seed=2))),
    ("raises_in_submodule", _seeded(RaisesInSubmodule), _inputs(_randn(2, 3))),
    ("python_numpy_random", _seeded(PythonNumpyRandom), _inputs(_randn(2, 3))),
    ("inplace_torch_function", _seeded(InplaceTorchFunction), _inputs(_randn(4, 3))),
    ("param_transpose", _seeded(ParamTranspose), _inputs(_randn(4, 3))),
    ("conditional_on_tensor", _seeded(ConditionalOnTensor), _inputs(_randn(2, 3).abs())),
    ("inplace_through_view", _seeded(InplaceThroughView), _inputs(_randn(2, 3))),
]
# fused fast paths, torch.ops, torch.sparse, functorch, parametrizations (models_paths.py)
REGISTRY += paths_registry(_seeded, _inputs, _randn)

REGISTRY_BY_NAME: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], Tuple[tuple, dict]]]] = {
    name: (make_model, make_inputs) for name, make_model, make_inputs in REGISTRY
}

__all__ = ["REGISTRY", "REGISTRY_BY_NAME"] + [
    name
    for name, obj in list(globals().items())
    if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__ == __name__
]
