"""The batched measurement on a GPU: the same statistics as the CPU's per-tensor path, the
compiled kernel agreeing with torch's eager one, and a logged step without a host sync."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from measure_nets import KINDS, small_net
from torch import nn

import torchlens as tl
from torchlens.train.measure import COMPILED, measure_batch, row_stats_eager
from torchlens.train.measure.rows import row_stats
from torchlens.web.exact import EXACT_FIELDS, exact_summary

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FIELDS = ("count", "mean", "std", "true_min", "true_max", "nan", "posinf", "neginf", "zeros", "line")


def planted(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3 + 0.5
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        return (x * 10).to(dtype)
    x = x.to(dtype)
    if n > 8:
        x[1], x[3], x[5], x[7] = float("nan"), float("inf"), -float("inf"), 0.0
    return x


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]
)
def test_batch_on_cuda_equals_float64_reference(dtype):
    tensors = [planted(n, dtype, i) for i, n in enumerate([1, 7, 1000, 1024, 4097, 70000, (1 << 22) + 3])]
    got = measure_batch([t.cuda() for t in tensors], 100, lambda d: None)
    for t, row, sample in zip(tensors, got.rows, got.samples):
        ref = exact_summary(t.double())
        assert row.is_cuda and sample.is_cuda and sample.numel() == min(t.numel(), 100)
        _close(row.cpu(), ref, rtol=1e-12 if dtype == torch.float64 else 1e-5)


def test_compiled_kernel_agrees_with_eager():
    x = torch.randn(300, 1024, device="cuda") * 5 + 2
    x[0, 0], x[1, 1], x[2, 2], x[3, :] = float("nan"), float("inf"), -float("inf"), float("nan")
    eager = row_stats_eager(x)
    got = row_stats(x)  # compiled where Triton is present
    torch.testing.assert_close(got, eager, rtol=1e-9, atol=1e-9, equal_nan=True)
    print("measuring kernels:", "compiled" if COMPILED.fn is not None else f"eager ({COMPILED.error})")


def train_watched(model, device, tmp_path, name, steps=3):
    model = model.to(device)
    w = tl.watch(model, run_dir=str(tmp_path / name), backend=None, verbose=False, log=KINDS, input_grads=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64).to(device)
        y = torch.randint(0, 10, (4,), generator=g).to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w.close()
    return tl.open_run(w.run_dir), w


def test_logged_steps_on_cuda_equal_the_cpu_path(tmp_path):
    base = small_net(16).double()  # float64: the two devices compute the same values
    cpu_run, _ = train_watched(copy.deepcopy(base), "cpu", tmp_path, "cpu")
    gpu_run, w = train_watched(copy.deepcopy(base), "cuda", tmp_path, "cuda")
    assert w.recorder.batched.risky, "the in-place places were learned"
    names = cpu_run.series_names()
    assert sorted(names) == sorted(gpu_run.series_names())
    compared = 0
    for call, kind, name in names:
        a, b = cpu_run.series(call, kind, name), gpu_run.series(call, kind, name)
        assert a.steps.tolist() == b.steps.tolist(), (call, kind, name)
        for field in FIELDS:
            if field == "zeros" and kind in ("params_grad", "updates"):
                continue  # a bias before a BatchNorm: a gradient of ~1e-17 is exactly 0 on one device only
            x, y = getattr(a, field), getattr(b, field)
            assert np.allclose(x, y, rtol=1e-6, atol=1e-9, equal_nan=True), (call, kind, name, field, x, y)
        compared += 1
    assert compared > 20


def test_a_step_trained_on_a_side_stream_gives_the_run_of_the_default_stream(tmp_path):
    """The gradients' per-sample norms are samples taken as tensors on the GPU: the recorder
    notes their device, and the writer thread bins them on the stream training runs on (after
    the kernels that made them), whichever it is."""
    base = small_net(16).double()
    default_run, w = train_watched(copy.deepcopy(base), "cuda", tmp_path, "default")
    assert w.recorder.sampled_on == {torch.device("cuda", torch.cuda.current_device())}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        side_run, _ = train_watched(copy.deepcopy(base), "cuda", tmp_path, "side")
    torch.cuda.current_stream().wait_stream(side)
    names = default_run.series_names()
    assert sorted(names) == sorted(side_run.series_names())
    for call, kind, name in names:
        a, b = default_run.series(call, kind, name), side_run.series(call, kind, name)
        for field in FIELDS:
            if field == "zeros" and kind in ("params_grad", "updates"):
                continue  # a gradient of ~1e-17 may be exactly 0 in one run alone (see above)
            x, y = getattr(a, field), getattr(b, field)
            assert np.allclose(x, y, rtol=1e-6, atol=1e-9, equal_nan=True), (call, kind, name, field)


def test_a_logged_step_makes_no_host_sync(tmp_path):
    model = small_net(16).cuda()
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=KINDS)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(4, 3, 16, 16, device="cuda")
    y = torch.randint(0, 10, (4,), device="cuda")

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):  # the first logged step traces the graph; kernels compile
        step()
    w.flush()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):  # two logged steps: the first one ends (and is written) when the second starts
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    w.close()  # a write that synchronised (on the writer thread) would raise here
    run = tl.open_run(w.run_dir)
    assert run.steps.tolist() == [0, 1, 2, 3, 4]
    s = run.series("1.conv1:1", "io", "output 0")
    assert np.isfinite(s.mean).all() and (s.count > 0).all()


def _close(row, ref, rtol):
    for field, a, r in zip(EXACT_FIELDS, row.tolist(), ref.tolist()):
        if field == "line":
            continue
        if np.isnan(r):
            assert np.isnan(a), (field, a, r)
        else:
            assert a == pytest.approx(r, rel=rtol, abs=1e-9), (field, a, r)


def test_the_triton_kernels_agree_with_torch_on_cuda(monkeypatch):
    from torchlens.train.measure import batch
    from torchlens.train.measure.kernels import TRITON, Kernels

    sizes = [1, 1000, (1 << 22) + 3, 70000]
    tensors = [planted(n, torch.float32, i).cuda() for i, n in enumerate(sizes)]
    tensors += [planted(5000, torch.float64, 9).cuda(), planted(300, torch.int64, 3).cuda()]

    def gen(device):
        return torch.Generator(device).manual_seed(3)

    small = [t for t in tensors if t.numel() < (1 << 22)]
    fast, fast_small = measure_batch(tensors, 100, gen), measure_batch(small, 100, gen)
    if TRITON.fns is None:
        pytest.skip(f"the Triton kernels are off here: {TRITON.error}")
    off = Kernels()
    off.error = "off for this test"
    monkeypatch.setattr(batch, "TRITON", off)
    slow, slow_small = measure_batch(tensors, 100, gen), measure_batch(small, 100, gen)
    for t, a, b, sa, sb in zip(tensors, fast.rows, slow.rows, fast.samples, slow.samples):
        torch.testing.assert_close(a[:9], b[:9], rtol=1e-6, atol=1e-9, equal_nan=True)
        _close(a.cpu(), exact_summary(t.cpu().double()), rtol=1e-12 if t.dtype == torch.float64 else 1e-5)
        # the kernels read the large tensor whole, torch its body and its tail: other draws
        assert sa.shape == sb.shape and bool(torch.isin(sa[~sa.isnan()], t.float()).all())
    for sa, sb in zip(fast_small.samples, slow_small.samples):
        assert torch.equal(sa, sb)  # the same positions, read by the gather kernel or by take


def test_histograms_of_a_cuda_phase_as_it_lies_equal_those_of_its_views():
    """A GPU step hands the writer its samples as pieces of a phase's samples on the device and
    its statistics as rows of the phase's host table (or of a device table: the per-sample
    norms'): binned from there, every field equals what binning the views gives."""
    from torchlens.train.measure import LayoutCache, table_rows
    from torchlens.web.stats import Row, as_tensor, histograms

    tensors = [planted(40 + i, torch.float32, i).cuda() for i in range(12)]
    tensors += [torch.randn(5, 9 + i, device="cuda").to(torch.bfloat16) for i in range(6)]
    b = measure_batch(tensors, 16, lambda d: None, LayoutCache())
    samples = list(b.pieces)
    on_host = [Row(b.tables[device].cpu(), j) for device, j in b.where]
    on_device = table_rows([as_tensor(s) for s in samples])
    assert on_device[0].table.is_cuda
    for summaries in (on_host, on_device):
        got = histograms(samples, 0.1, summaries=summaries)
        want = histograms([as_tensor(s) for s in samples], 0.1, summaries=[as_tensor(r) for r in summaries])
        for field in ("counts", "lo", "hi", "nonfinite", "sums", "sums_of_squares", "exact"):
            assert np.array_equal(getattr(got, field), getattr(want, field), equal_nan=True), field
