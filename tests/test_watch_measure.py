"""The batched measurement (torchlens.train.measure) on CPU tensors: the same statistics as the
per-tensor path (float64 reference), samples drawn from the values, a number of operations that
does not grow with the number of tensors, and a watched training run whose numbers equal those of
the CPU's own path."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from measure_nets import KINDS, small_net
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import torchlens as tl
from torchlens.train.measure import LayoutCache, LazySummary, layout, measure_batch, row_stats_eager
from torchlens.train.measure.phase import Measured, PhaseMeasure
from torchlens.train.record import NormsLater, Sampler
from torchlens.web.exact import EXACT_FIELDS, exact_summary
from torchlens.web.stats import as_tensor

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.uint8, torch.bool]
FIELDS = ("count", "mean", "std", "true_min", "true_max", "nan", "posinf", "neginf", "zeros", "line")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks small enough that CPU-sized tensors are read in place and split across buffers."""
    monkeypatch.setattr(layout, "BIG", 3000)
    monkeypatch.setattr(layout, "CHUNK", 8192)


def planted(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3 + 0.5
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        return (x.abs() * 10).to(dtype)
    x = x.to(dtype)
    if n > 8:
        x[1], x[3], x[5], x[7] = float("nan"), float("inf"), -float("inf"), 0.0
    return x


def assert_row(row, ref, rtol):
    for field, a, r in zip(EXACT_FIELDS, row.tolist(), ref.tolist()):
        if field == "line":
            continue
        if np.isnan(r):
            assert np.isnan(a), (field, a, r)
        else:
            assert a == pytest.approx(r, rel=rtol, abs=1e-9), (field, a, r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_equals_the_float64_reference(dtype, small_blocks):
    sizes = [1, 3, 9, 1023, 1024, 1025, 2999, 3000, 5000, 8192, 20001]
    tensors = [planted(n, dtype, i) for i, n in enumerate(sizes)]
    got = measure_batch(tensors, 50, lambda d: None)
    # float32 data: deviations in float32, sums in float64 (a few float32 ulps on m2)
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    for t, row in zip(tensors, got.rows):
        assert_row(row, exact_summary(t.double()), rtol)


def test_odd_layouts_and_values(small_blocks):
    base = torch.randn(6, 5, 40)
    tensors = [
        base.permute(2, 0, 1),  # dense, not contiguous: read in place, in memory order
        base[:, ::2],  # gaps: copied
        base.to(memory_format=torch.contiguous_format).expand(2, 6, 5, 40),  # repeated values
        torch.full((7,), float("nan")),  # nothing finite
        torch.tensor([-0.0, 0.0, 5.0]),
        torch.full((4000,), 1e6) + torch.arange(4000.0) * 1e-2,  # far from zero, small spread
    ]
    got = measure_batch(tensors, 20, lambda d: None)
    for t, row in zip(tensors, got.rows):
        assert_row(row, exact_summary(t.double()), 1e-5)


def test_unmeasurable_tensors_are_left_out():
    tensors = [torch.ones(3, dtype=torch.complex64), torch.zeros(0), torch.ones(2)]
    got = measure_batch(tensors, 5, lambda d: None)
    assert got.rows[0] is None and got.rows[1] is None and got.samples[0] is None
    assert got.rows[2][0].item() == 2.0


def test_samples_are_values_of_their_tensor(small_blocks):
    tensors = [torch.arange(10.0), torch.arange(100.0, 20100.0), torch.arange(7, dtype=torch.int64)]
    got = measure_batch(tensors, 400, lambda d: None)
    a, b, c = got.samples
    assert a.tolist() == tensors[0].tolist() and c.tolist() == list(map(float, range(7)))  # all, in order
    assert b.dtype == torch.float32 and b.numel() == 400
    assert ((b >= 100) & (b < 20100) & (b == b.round())).all()
    # the large tensor spans several blocks: its sample reaches every part of it, uniformly
    counts = np.histogram(b.numpy(), bins=4, range=(100, 20100))[0]
    assert counts.min() > 60, counts


def test_sample_n_none_takes_every_value():
    t = torch.randn(3000)
    got = measure_batch([t], None, lambda d: None)
    assert torch.equal(got.samples[0], t)


def test_row_stats_of_a_row_without_finite_values():
    row = row_stats_eager(torch.tensor([[float("nan"), float("inf")]]))[0].tolist()
    assert row[:5] == [0.0, 0.0, 1.0, 1.0, 0.0]


def same_batch(a, b):
    for x, y in zip(a.rows + a.samples, b.rows + b.samples):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y) or torch.allclose(x, y, equal_nan=True, rtol=0, atol=0), (x, y)


def seeded(seed):
    return lambda d: torch.Generator(d).manual_seed(seed)


def test_a_cached_layout_gives_what_a_new_one_gives(small_blocks):
    cache = LayoutCache()
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        tensors = [torch.randn(n, generator=g) for n in (5, 1000, 4000, 20001)]
        tensors += [
            torch.randn(6, 5, 40, generator=g).permute(2, 0, 1),
            torch.arange(9),
            torch.ones(3, dtype=torch.complex64),
        ]
        cached = measure_batch(tensors, 64, seeded(step), cache)
        same_batch(cached, measure_batch(tensors, 64, seeded(step)))
        for t, row in zip(tensors[:-1], cached.rows):
            assert_row(row, exact_summary(t.double()), 1e-5)
    assert cache.builds == 1  # one signature, three steps


def test_a_changed_set_of_tensors_builds_a_new_layout(small_blocks):
    cache = LayoutCache()
    model = nn.Linear(30, 40)

    def step(batch, weight=None):
        tensors = [torch.randn(batch, 30), model.weight, model.bias]
        if weight is not None:
            tensors[1] = weight
        got = measure_batch(tensors, 16, seeded(0), cache)
        for t, row, sample in zip(tensors, got.rows, got.samples):
            assert_row(row, exact_summary(t.detach().double()), 1e-5)
            assert sample.numel() == min(16, t.numel()) and torch.isin(sample, t.detach().float()).all()
        return got

    step(8)
    step(8)
    assert cache.builds == 1
    step(5)  # another batch size
    assert cache.builds == 2
    model.weight = nn.Parameter(torch.randn(40, 30) + 7)  # replaced by one of the same signature: kept
    step(5)
    assert cache.builds == 2
    step(5, weight=torch.randn(30, 40).t() * 3)  # same shape, other strides
    assert cache.builds == 3
    step(5, weight=torch.randn(40, 30, dtype=torch.float64))  # another dtype
    assert cache.builds == 4
    step(8)  # the first signature again: still kept
    assert cache.builds == 4


def test_a_tensor_read_from_two_sources_gets_fixed_shares(small_blocks):
    t = torch.arange(5000.0)  # 4 rows read in place (4096 values), 904 packed
    first = measure_batch([t], 500, seeded(0)).samples[0]
    second = measure_batch([t], 500, seeded(1)).samples[0]
    for s in (first, second):
        assert int((s >= 4096).sum()) == round(500 * 904 / 5000)  # the tail's share, every step
    assert not torch.equal(first, second)  # positions drawn afresh


class Count(TorchDispatchMode):
    """Counts the ATen operations that compute (views only name memory: no kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops += 1
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_operations_do_not_grow_with_the_number_of_tensors():
    def ops(n):
        tensors = [torch.randn(64) for _ in range(n)] + [torch.randn(5, 7) for _ in range(n)]
        with Count() as count:
            measure_batch(tensors, 16, lambda d: None)
        return count.ops

    assert ops(200) <= ops(10) + 5  # views aside: no operation per tensor


def test_one_dimensional_tensors_are_measured_without_a_view_each():
    """A bias is its own flat view: on a GPU host each view is a dispatch of its own."""

    class Views(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += bool(func.is_view)
            return func(*args, **(kwargs or {}))

    def views(n):
        tensors, cache = [torch.randn(64) for _ in range(n)], LayoutCache()
        measure_batch(tensors, 16, lambda d: None, cache)  # the layout (built once a signature)
        with Views() as count:
            b = measure_batch(tensors, 16, lambda d: None, cache)
        assert b.rows[-1][1].item() == pytest.approx(tensors[-1].double().mean().item())
        return count.ops

    assert views(200) <= views(10) + 5


def test_phase_learns_the_places_changed_in_place():
    pm = PhaseMeasure(4, lambda d: None)
    x = torch.tensor([1.0, -2.0])
    first = pm.add(x, place="bn")  # a new place: copied when seen
    x.relu_()
    pm.flush()
    assert first.summary[3].item() == -2.0 and pm.risky == {"bn"}
    y = torch.tensor([3.0, -4.0])
    second = pm.add(y, place="bn")  # learned: copied again
    y.relu_()
    z = torch.tensor([5.0])
    third = pm.add(z, place="other")
    pm.flush()
    assert second.summary[3].item() == -4.0 and third.summary[1].item() == 5.0 and pm.risky == {"bn"}
    w = torch.tensor([-1.0])
    lost = pm.add(w, place="other")  # known to be safe, yet changed: no values rather than false ones
    w.relu_()
    pm.flush()
    assert lost.summary is None and lost.sample.numel() == 0 and "other" in pm.risky


def test_a_tensor_whose_storage_is_freed_before_its_phase_ends_gets_no_values():
    """FSDP frees a parameter by shrinking its storage to nothing: its version does not move,
    its values are gone all the same."""
    pm = PhaseMeasure(4, lambda d: None)
    pm.add(torch.ones(8), place="fc.weight")
    pm.flush()  # the place is known now: its tensors are read at the phase's end, not copied
    freed = torch.ones(8)
    measured = pm.add(freed, place="fc.weight")
    version = freed._version
    freed.untyped_storage().resize_(0)
    assert freed._version == version
    pm.flush()
    assert measured.summary is None and measured.sample.numel() == 0 and "fc.weight" in pm.risky


def test_copies_are_measured_early_past_the_budget():
    pm = PhaseMeasure(4, lambda d: None, budget=1000)
    tensors = [torch.full((100,), float(i)) for i in range(5)]
    measured = [pm.add(t, place=i) for i, t in enumerate(tensors)]
    assert measured[0].measured and measured[1].measured  # 800 bytes, then 1200: flushed
    for t in tensors:
        t.zero_()
    pm.flush()
    assert [m.summary[1].item() for m in measured[:3]] == [0.0, 1.0, 2.0]


# ----- a watched training run: the batched path on the CPU against the CPU's own path ----------


def train_watched(model, tmp_path, name, batched, steps=3, fail_at=None):
    w = tl.watch(model, run_dir=str(tmp_path / name), backend=None, verbose=False, log=KINDS, input_grads=True)
    if batched:
        w.recorder.batch_devices = frozenset({"cpu"})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        x = torch.randn(4, 3, 8, 8, generator=g)
        y = torch.randint(0, 10, (4,), generator=g)
        if i == fail_at:
            with pytest.raises(RuntimeError):
                model(x.reshape(4, 3, 4, 16)[..., :3])  # a shape the linear layer refuses, half-way
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w.close()
    return tl.open_run(w.run_dir), w


def test_watched_run_equals_the_per_tensor_path(tmp_path):
    base = small_net()
    plain, _ = train_watched(copy.deepcopy(base), tmp_path, "plain", batched=False)
    batched, w = train_watched(copy.deepcopy(base), tmp_path, "batched", batched=True)
    # learned: each BatchNorm output changed later (by ReLU(inplace) or out += x), and the second
    # ReLU's input (changed by the ReLU itself)
    assert ("1.bn1:1", "io", "output 0") in w.recorder.batched.risky
    assert ("1.bn2:1", "io", "output 0") in w.recorder.batched.risky
    assert ("0:1", "io", "output 0") not in w.recorder.batched.risky
    names = plain.series_names()
    assert sorted(names) == sorted(batched.series_names()) and len(names) > 40
    for call, kind, name in names:
        a, b = plain.series(call, kind, name), batched.series(call, kind, name)
        assert a.steps.tolist() == b.steps.tolist() == [0, 1, 2], (call, kind, name)
        for field in FIELDS:
            x, y = getattr(a, field), getattr(b, field)
            assert np.allclose(x, y, rtol=2e-5, atol=1e-7, equal_nan=True), (call, kind, name, field, x, y)


def test_logged_steps_keep_their_layouts(tmp_path):
    model = small_net()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=KINDS)
    w.recorder.batch_devices = frozenset({"cpu"})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    builds = []
    for batch in (4, 4, 4, 4, 3, 3):
        loss = nn.functional.cross_entropy(model(torch.randn(batch, 3, 8, 8)), torch.randint(0, 10, (batch,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        builds.append(w.recorder.batched.layouts.builds)
    w.close()
    # the forward, the gradients, the updates: three layouts, kept (places learned to be copied
    # give copies of the same signature); another batch size changes the forward's alone
    assert builds == [3, 3, 3, 3, 4, 4]


def test_a_step_that_fails_half_way_leaves_the_next_one_whole(tmp_path):
    base = small_net()
    plain, _ = train_watched(copy.deepcopy(base), tmp_path, "plain", batched=False)
    batched, _ = train_watched(copy.deepcopy(base), tmp_path, "failed", batched=True, fail_at=1)
    for call, kind, name in plain.series_names():
        a, b = plain.series(call, kind, name), batched.series(call, kind, name)
        for field in ("count", "mean", "true_max"):
            assert np.allclose(getattr(a, field)[-1], getattr(b, field)[-1], rtol=2e-5, equal_nan=True)


# ----- the Triton kernels (kernels.py), run by Triton's interpreter on the CPU ------------------

TRITON_CHECK = r"""
import numpy as np, torch
from torchlens.train.measure import batch, layout
from torchlens.train.measure.kernels import Kernels
from torchlens.web.exact import exact_summary
layout.BIG, layout.CHUNK = 3000, 8192
g = torch.Generator().manual_seed(0)
tensors = [torch.randn(n, generator=g) * 3 + 1 for n in (1, 9, 1024, 3000, 5000)]
tensors += [torch.randn(4100, generator=g, dtype=torch.float64), torch.arange(7), torch.rand(40, generator=g) > 0.5]
tensors += [torch.randn(4, 1030, generator=g).t(), torch.randn(3000, generator=g).half()]
tensors[4][[1, 3, 5, 7, 4097]] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, float("nan")])
# a row of a larger tensor (its values start past its storage's), a 0-d one, a channels-last
# activation, bfloat16 (all read at their addresses) and an expanded one (gaps: packed)
tensors += [torch.randn(3, 2000, generator=g)[1], torch.tensor(2.5), torch.randn(1500, generator=g).bfloat16()]
tensors += [torch.randn(2, 3, 5, 7, generator=g).to(memory_format=torch.channels_last)]
tensors += [torch.randn(5, 1, generator=g).expand(5, 300)]
def run(kernels):
    batch.TRITON = kernels
    return batch.measure_batch(tensors, 200, lambda d: torch.Generator(d).manual_seed(5))
eager = run(Kernels())
kernels = Kernels(interpret=True)
fast = run(kernels)
assert kernels.fns is not None and kernels.error is None, kernels.error
# the kernels read the dense float tensors at their own addresses: the other layout draws its
# samples elsewhere, so each sample is checked to be as long and made of the tensor's values
(group,) = batch.plan(batch.signature(tensors), 200, addressed=frozenset({torch.device("cpu")})).groups
assert group.addressed and sum(not s.parts for s in group.sources) == 12, group.sources
for t, a, b, sa, sb in zip(tensors, eager.rows, fast.rows, eager.samples, fast.samples):
    ref = exact_summary(t.double())
    assert torch.allclose(a[:9], b[:9], rtol=1e-6, atol=1e-9, equal_nan=True), (a, b)
    assert torch.allclose(b[:9], ref[:9], rtol=1e-9 if t.dtype == torch.float64 else 1e-5, atol=1e-9, equal_nan=True), (b, ref)
    values = t.reshape(-1).float()
    assert sa.shape == sb.shape and bool(torch.isin(sb[~sb.isnan()], values).all()), (sb, t)
    if t.numel() <= 200:  # every value, in order
        assert torch.equal(sb, values), (sb, t)
print("agree", len(tensors))
"""


def test_the_triton_kernels_agree_with_torch(tmp_path):
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")  # read when Triton is imported: a process of its own
    done = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "agree 15" in done.stdout, done.stderr[-3000:]


RUN_CHECK = r"""
import copy, sys, tempfile
import numpy as np, torch
from torch import nn
import torchlens as tl
from torchlens.train.measure import batch
from torchlens.train.measure.kernels import Kernels
sys.path.insert(0, sys.argv[1])
from measure_nets import KINDS, small_net

def train(model, batched):
    w = tl.watch(model, run_dir=tempfile.mkdtemp(), backend=None, verbose=False, log=KINDS, input_grads=True)
    if batched:
        w.recorder.batch_devices = frozenset({"cpu"})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8, generator=g)), torch.randint(0, 10, (4,), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    w.close()
    return tl.open_run(w.run_dir)

base = small_net()
plain = train(copy.deepcopy(base), batched=False)
kernels = batch.TRITON = Kernels(interpret=True)  # each tensor read at its address, as on a GPU
fast = train(copy.deepcopy(base), batched=True)
assert kernels.fns is not None and kernels.error is None, kernels.error
names = plain.series_names()
assert sorted(names) == sorted(fast.series_names()) and len(names) > 40
for call, kind, name in names:
    a, b = plain.series(call, kind, name), fast.series(call, kind, name)
    assert a.steps.tolist() == b.steps.tolist() == [0, 1, 2], (call, kind, name)
    for field in ("count", "mean", "std", "true_min", "true_max", "nan", "posinf", "neginf", "zeros"):
        x, y = getattr(a, field), getattr(b, field)
        assert np.allclose(x, y, rtol=2e-5, atol=1e-7, equal_nan=True), (call, kind, name, field, x, y)
print("runs agree", len(names))
"""


def test_a_run_measured_by_the_triton_kernels_equals_the_per_tensor_path():
    """The whole logged step as a GPU runs it (the kernels reading each tensor at its address,
    the samples split on the writer thread), by Triton's interpreter: the same run."""
    pytest.importorskip("triton")
    import os
    import pathlib
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")  # read when Triton is imported: a process of its own
    here = str(pathlib.Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", RUN_CHECK, here], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "runs agree" in done.stdout, done.stderr[-3000:]


def test_the_triton_kernels_compile_for_a_gpu():
    """Compiled for an H100/H200 (sm_90) ahead of time: no GPU needed to see that they build."""
    pytest.importorskip("triton")
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from torchlens.train.measure.kernels import _define

    row, gather, merge = _define()
    target = GPUTarget("cuda", 90, 32)

    def build(fn, args, constants):
        signature = {**args, **{name: "constexpr" for name in constants}}
        source = ASTSource(fn=fn, signature=signature, constexprs=constants)
        compiled = triton.compile(source, target=target, options={"num_warps": 4})
        assert len(compiled.asm["cubin"]) > 1000

    rows_of = {"ptrs": "*i64", "row_src": "*i64", "row_at": "*i64", "row_n": "*i64", "out": "*fp64"}
    draws_of = {"ptrs": "*i64", "draw_src": "*i64", "at": "*i64", "slot": "*i64", "out": "*fp32", "n": "i32"}
    for dtype in (tl.float32, tl.float64, tl.float16, tl.bfloat16):  # the packed and the addressed dtypes
        build(row, rows_of, {"DTYPE": dtype, "WIDTH": 1024})
        build(gather, draws_of, {"DTYPE": dtype, "SPAN": 1024})
    build(merge, {"stats": "*fp64", "runs": "*i64", "numel": "*fp64", "pads": "*fp64", "out": "*fp64"}, {"CH": 256})


class _Cast(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


class _Empty(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:0]


_EVERY_DTYPE = [torch.bfloat16, torch.float16, torch.int32, torch.bool, torch.complex64]
_EVERY_DTYPE += [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d]


@pytest.mark.parametrize("batched", [False, True], ids=["per-tensor", "batched"])
def test_every_dtype_is_measured_or_skipped_with_its_reason(tmp_path, batched):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.casts = nn.ModuleList([_Cast(d) for d in _EVERY_DTYPE])
            self.large = _Cast(_EVERY_DTYPE[-1])  # past the size measured in small batches
            self.empty = _Empty()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            for cast in self.casts:
                cast(y.detach())
            self.large(torch.linspace(-2, 2, 40000))
            self.empty(y)
            return y.sum()

    model = Net()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=("io",))
    if batched:
        w.recorder.batch_devices = frozenset({"cpu"})
    for _ in range(3):
        model(torch.randn(2, 4)).backward()
    w.close()
    run = tl.open_run(w.run_dir)
    for i, dtype in enumerate(_EVERY_DTYPE):
        s = run.series(f"casts.{i}:1", "io", "output 0")
        if dtype.is_complex:
            assert s.steps.tolist() == [] and "complex" in s.reason, dtype
            continue
        assert s.steps.tolist() == [0, 1, 2] and s.reason is None, dtype
        assert np.isfinite(s.mean[-1]) and s.true_min[-1] <= s.mean[-1] <= s.true_max[-1], dtype
    large = run.series("large:1", "io", "output 0")
    assert large.true_min[-1] == -2.0 and large.true_max[-1] == 2.0 and abs(large.mean[-1]) < 1e-3
    empty = run.series("empty:1", "io", "output 0")
    assert empty.steps.tolist() == [] and "no values" in empty.reason


def test_samples_drawn_together_are_each_of_their_own_tensor():
    from torchlens.train.record.sampling import Sampler

    tensors = [torch.full((6, 50), float(i)) for i in range(40)] + [torch.arange(7.0), torch.ones(3, dtype=torch.int8)]
    tensors += [torch.zeros(0), torch.ones(2, dtype=torch.complex64)]
    with Count() as count:
        rows = Sampler(sample_n=20).values_of(tensors)
    for i in range(40):
        assert rows[i].dtype == torch.float32 and rows[i].shape == (20,) and (rows[i] == i).all()
    assert rows[40].tolist() == list(range(7)) and rows[41].tolist() == [1.0] * 3
    assert rows[42] is None and rows[43] is None
    tensors[0].add_(100)  # a later change does not reach a drawn sample
    assert (rows[0] == 0).all()
    with Count() as more:
        Sampler(sample_n=20).values_of(tensors[:40] * 5)
    assert more.ops <= count.ops + 5  # views aside: one draw per group, not per tensor


def _training_step(model, width):
    """One SGD training step of ``model`` on a random batch of 4 rows of ``width`` values."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        loss = model(torch.randn(4, width)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _mlp_training(layers):
    """An MLP of ``layers`` Linear(16, 16) and ReLU pairs, and one SGD training step of it."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(16, 16), nn.ReLU())])
    return model, _training_step(model, 16)


@pytest.mark.parametrize("kinds", [("io", "params"), ("io_grad", "params_grad")])
def test_a_logged_cpu_step_adds_operations_that_do_not_grow_with_its_tensors(tmp_path, kinds):
    def added(layers):
        model, step = _mlp_training(layers)
        with Count() as plain:
            step()
        w = tl.watch(model, run_dir=str(tmp_path / f"run{layers}"), backend=None, verbose=False, log=kinds)
        for _ in range(2):  # the places are learned in the first logged steps
            step()
        with Count() as logged:
            step()
        w.close()
        return logged.ops - plain.ops

    # 5 against 60 layers (30 against 360 series): the copies are one cat per phase, and the
    # gradients' per-sample norms one stack and one norm per shape, not one of each per tensor
    assert added(60) <= added(5) + 12


class _OneLaunch:
    """The measuring kernels as a CUDA step launches them, run on the CPU: each launch one
    operation (a zero fill of its output; the values are not what is checked here)."""

    def applies(self, device):
        return True

    def get(self):
        return ()

    def rows(self, ptrs, rows, dtype):
        return torch.zeros(rows[0].numel(), 8, dtype=torch.float64)

    def merge(self, stats, runs, numel, pads):
        return torch.zeros(numel.numel(), 10, dtype=torch.float64)

    def gather(self, ptrs, index, out, dtype):
        out.zero_()
        return True


_VIEWS = frozenset(
    "aten::" + name
    for name in (
        "detach view view_as reshape _reshape_alias t transpose permute expand unsqueeze squeeze "
        "select slice split split_with_sizes unbind as_strided alias narrow flatten unflatten"
    ).split()
)


def _computing_ops_on_every_thread(run) -> int:
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    config = _ExperimentalConfig(profile_all_threads=True)  # the writer thread's binning counts
    with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        run()
    return sum(e.name.startswith("aten::") and e.name not in _VIEWS for e in prof.events())


def test_the_cuda_path_adds_operations_that_do_not_grow_with_tensors_of_many_lengths(tmp_path, monkeypatch):
    from torchlens.train.measure import batch

    monkeypatch.setattr(batch, "TRITON", _OneLaunch())

    def added(layers):
        torch.manual_seed(0)
        widths = [8 + 3 * i for i in range(layers + 1)]  # every layer its own shapes and lengths
        model = nn.Sequential(*[m for i in range(layers) for m in (nn.Linear(widths[i], widths[i + 1]), nn.ReLU())])
        model.append(nn.Linear(widths[-1], 1))
        step = _training_step(model, 8)
        plain = _computing_ops_on_every_thread(step)
        w = tl.watch(
            model,
            run_dir=str(tmp_path / f"run{layers}"),
            backend=None,
            verbose=False,
            log=("io", "params", "params_grad"),
        )
        w.recorder.batch_devices = frozenset({"cpu"})  # measured as on a GPU
        for _ in range(2):  # the first logged steps learn the layouts
            step()
            w.flush()
        logged = _computing_ops_on_every_thread(lambda: (step(), w.flush()))
        w.close()
        return logged - plain

    # 6 against 40 layers of distinct widths (samples of about 80 distinct lengths): the
    # measuring and the binning, outlier rejection included, are a fixed number of operations
    few, many = added(6), added(40)
    assert many <= few + 30, (few, many)


def _called_ops_on_every_thread(run) -> int:
    """The ATen operations ``run`` calls, views included, on every thread; not those torch's own
    kernels call inside them (CPU ``cat`` copies each input through views from some size on)."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    config = _ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
        run()
    called = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::") for e in called)


def test_a_logged_cuda_step_adds_one_operation_per_watched_call_and_none_per_series(tmp_path, monkeypatch):
    """The four default kinds, measured as a GPU step measures them: everything a logged step
    adds, views included, on the training and the writer thread, is a fixed number of
    operations plus one per watched call (its input's alias, which the per-call gradient hooks
    need), not several per series."""
    from torchlens.train.measure import batch

    monkeypatch.setattr(batch, "TRITON", _OneLaunch())

    def added(layers):
        model, step = _mlp_training(layers)
        for _ in range(2):
            step()
        plain = _called_ops_on_every_thread(step)
        w = tl.watch(model, run_dir=str(tmp_path / f"run{layers}"), backend=None, verbose=False)
        w.recorder.batch_devices = frozenset({"cpu"})  # measured as on a GPU
        for _ in range(2):  # the first logged steps learn the layouts and trace the graph
            step()
            w.flush()
        logged = _called_ops_on_every_thread(lambda: (step(), w.flush()))
        w.close()
        return logged - plain

    few, many = added(5), added(40)
    aliases = 2 * (40 - 5)  # every module call but the first (the data needs no gradient)
    assert many - few <= aliases + 10, (few, many)


def test_tensors_read_at_their_addresses_cost_no_operation_each(monkeypatch):
    """Where the kernels read every dense tensor at its own address (on a GPU), measuring a
    phase makes the same operations, views and those inside ``cat`` included, for 200 tensors
    as for 10: nothing is viewed, flattened or packed per tensor on the training thread."""
    from torch.profiler import ProfilerActivity, profile

    from torchlens.train.measure import batch

    monkeypatch.setattr(batch, "TRITON", _OneLaunch())

    def ops(n):
        g = torch.Generator().manual_seed(n)
        tensors = []
        for i in range(n):  # 1-D, 2-D, a transposed one (dense), half precision
            tensors += [torch.randn(64 + i, generator=g), torch.randn(5, 7 + i, generator=g)]
            tensors += [torch.randn(9, 3 + i, generator=g).t(), torch.randn(33, generator=g).bfloat16()]
        cache = LayoutCache()
        measure_batch(tensors, 16, lambda d: None, cache)  # the layout (built once a signature)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            b = measure_batch(tensors, 16, lambda d: None, cache)
        (kept,) = cache._layouts.values()
        assert all(g.addressed and not any(s.parts for s in g.sources) for g in kept.groups)
        assert len(b.pieces) == 4 * n
        return sum(e.name.startswith("aten::") for e in prof.events())

    few, many = ops(10), ops(200)
    assert many == few, (few, many)


def _measured_refs(n):
    """A measured batch of ``4 * n`` tensors (NaN and infinities planted), as a logged step hands
    it to the writer thread: ``Piece``s of the group's samples and ``Row``s of its table."""
    from torchlens.web.stats import Row

    tensors = []
    for i in range(n):
        tensors += [planted(40 + i, torch.float32, i), torch.randn(5, 7 + i), planted(30, torch.float64, i + n)]
        tensors += [planted(90 + i, torch.bfloat16, 2 * n + i)]
    b = measure_batch(tensors, 16, lambda d: torch.Generator().manual_seed(0), LayoutCache())
    samples = list(b.pieces)
    summaries = [Row(b.tables[device], j) for device, j in b.where]
    return samples, summaries


@pytest.mark.parametrize("reject", [0.0, 0.1])
def test_histograms_of_samples_and_rows_as_they_lie_equal_those_of_their_views(reject):
    """A logged step hands the writer thread its samples as ``Piece``s of a phase's buffer and
    its exact summaries as ``Row``s of the phase's table; binned from there, every field equals
    what binning each sample's own view (and stacking each row) gives, in any order."""
    from torchlens.web.stats import as_tensor, histograms

    samples, summaries = _measured_refs(12)
    order = list(range(len(samples)))
    random.Random(0).shuffle(order)  # series need not come in the order of their phase
    samples, summaries = [samples[i] for i in order], [summaries[i] for i in order]
    summaries[3] = None  # a series without a summary
    summaries[5] = as_tensor(summaries[5]).clone()  # one measured on its own
    samples.insert(7, torch.tensor([1.0, float("nan"), 4.0]))  # a loose sample among the pieces
    summaries.insert(7, None)
    got = histograms(samples, reject, summaries=summaries)
    want = histograms([as_tensor(s) for s in samples], reject, summaries=[as_tensor(v) for v in summaries])
    for field in ("counts", "lo", "hi", "nonfinite", "sums", "sums_of_squares", "exact"):
        assert np.array_equal(getattr(got, field), getattr(want, field), equal_nan=True), field
    assert np.isnan(got.exact[3]).all() and not np.isnan(got.exact[5]).all()


def test_binning_a_phase_as_it_lies_costs_no_operation_per_series():
    """The writer thread bins a phase's samples and places its rows in as many operations for
    800 series as for 40: no view, ``select`` or ``cat`` input per series. Counted: the
    operations called, not those torch's own kernels call inside them (from some size on, its
    CPU ``cat`` copies each input through a view, ``zero_`` calls ``fill_``: a constant)."""
    from torch.profiler import ProfilerActivity, profile

    from torchlens.web.stats import histograms

    def ops(n):
        samples, summaries = _measured_refs(n)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            h = histograms(samples, 0.1, summaries=summaries)
        assert h.counts.shape[0] == 4 * n and not np.isnan(h.exact[:, 0]).any()
        called = [e for e in prof.events() if e.name.startswith("aten::")]
        return sum(e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::") for e in called)

    few, many = ops(10), ops(200)
    assert many == few, (few, many)


class _FailsOnce(_OneLaunch):
    """Kernels whose launch ``failing`` fails and turns them off from then on (as ``Kernels``
    does); the launches before it run."""

    def __init__(self, failing):
        self.failing, self.off = failing, False

    def get(self):
        return None if self.off else ()

    def rows(self, ptrs, rows, dtype):
        return self._fail() if self.failing == "rows" else super().rows(ptrs, rows, dtype)

    def merge(self, stats, runs, numel, pads):
        return self._fail() if self.failing == "merge" else super().merge(stats, runs, numel, pads)

    def gather(self, ptrs, index, out, dtype):
        return self._fail() is not None if self.failing == "gather" else super().gather(ptrs, index, out, dtype)

    def _fail(self):
        self.off = True
        return None


@pytest.mark.parametrize("failing", ["rows", "merge", "gather"])
def test_kernels_that_fail_on_tensors_laid_out_for_them_leave_torch_to_measure_them(monkeypatch, failing):
    from torchlens.train.measure import batch

    monkeypatch.setattr(batch, "TRITON", _FailsOnce(failing))
    tensors = [planted(n, torch.float32, n) for n in (5, 1500, 3000)] + [torch.randn(4, 6).t()]
    cache = LayoutCache()
    b = measure_batch(tensors, 8, lambda d: None, cache)
    assert batch.TRITON.off and cache.builds == 2  # laid out for the kernels, then for torch
    for t, row, sample in zip(tensors, b.rows, b.samples):
        assert_row(row, exact_summary(t.double()), 1e-6)
        assert sample.shape == (min(8, t.numel()),)


def test_a_small_cpu_tensor_changed_later_in_its_phase_keeps_the_values_it_had(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True), nn.Linear(8, 1))
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=("io",))
    for _ in range(4):
        model(torch.randn(16, 8)).sum().backward()
    w.close()
    s = tl.open_run(w.run_dir).series("1:1", "io", "output 0")  # the BatchNorm's, before ReLU overwrote it
    assert s.steps.tolist() == [0, 1, 2, 3] and (s.true_min < 0).all() and np.allclose(s.mean, 0, atol=1e-6)


def test_the_forward_pass_is_measured_while_the_backward_pass_runs(tmp_path):
    model = small_net()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=KINDS)
    loss = model(torch.randn(4, 3, 8, 8)).sum()  # its copies are handed to the writer thread
    w._steps.wait()  # what the writer thread was given so far (no step is written yet)
    assert w.recorder.unmeasured() == []
    forward = [p[1] for parts in w.recorder.pending.values() for p in parts if isinstance(p[1], LazySummary)]
    assert len(forward) > 10 and all(s.measured and s.summary is not None for s in forward)
    assert w.recorder.sampled_on == set()  # no sample on a GPU: the forward's series are binned ahead too
    assert w._steps._ahead is not None and len(w._steps._ahead[2]) > 10
    assert tl.open_run(w.run_dir).steps.tolist() == []
    loss.backward()
    assert w.recorder.sampled_on == set()  # the gradients' norms are on the CPU too
    w.close()
    assert tl.open_run(w.run_dir).steps.tolist() == [0]


def test_a_measured_tensor_starts_as_a_lazy_summary_does():
    """``Measured`` sets LazySummary's slots itself (one call per tensor, not two): every slot a
    LazySummary starts with, it starts with too, at the same value."""
    values = torch.ones(2)
    lazy, measured = LazySummary(values), Measured(values)
    for name in LazySummary.__slots__:
        assert getattr(measured, name) is getattr(lazy, name), name
    assert not measured.measured


def test_a_phase_measured_later_takes_no_line():
    later = PhaseMeasure(3, lambda d: None, later=lambda tensors: [None] * len(tensors))
    with pytest.raises(ValueError, match="takes no line"):
        later.measure_now([torch.ones(2)], line=lambda table: table[:, 0])
    (m,) = later.measure_now([torch.tensor([1.0, 2.0])])
    assert m.values.tolist() == [1.0, 2.0] and not m.measured  # a copy, for the writer thread


def test_gradient_norms_computed_together_equal_those_computed_one_by_one():
    torch.manual_seed(0)
    grads = [
        torch.randn(4, 3, 2),
        torch.randn(4, 3, 2),
        torch.randn(4, 6),
        torch.randn(()),
        torch.randn(()),
        torch.randn(5, 2).bfloat16(),
        torch.randn(5, 2).bfloat16(),
        torch.randn(3, 2, 2).double(),
    ]
    grads[1][2, 1, 0] = float("nan")
    grads[2][0, 0] = float("inf")
    sampler = Sampler(sample_n=None)
    for got, grad in zip(map(as_tensor, sampler.norms_of(grads)), grads):
        assert torch.equal(got.isnan(), sampler.norms(grad).isnan()), grad.shape
        torch.testing.assert_close(got, sampler.norms(grad), equal_nan=True)
        assert got.dtype == torch.float32


def test_a_gradient_written_over_before_its_norms_are_computed_gets_none():
    kept, changed = torch.ones(2, 4), torch.ones(2, 4)
    later = [NormsLater(kept), NormsLater(changed)]
    changed.mul_(3)  # the values that arrived are gone: nothing is claimed about them
    NormsLater.resolve(later, Sampler(sample_n=1))
    assert later[0].norms.tolist() == [2.0, 2.0] and later[0].sample.numel() == 1
    assert later[1].norms is None and later[1].sample.numel() == 0
