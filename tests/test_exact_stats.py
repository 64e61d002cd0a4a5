"""The exact summary of a CPU tensor (``torchlens.web.exact``; batched and deferred: ``torchlens.train.measure.exact``): the same counts and extremes as
torch's float64 reductions, mean and spread to float64 rounding, whatever its dtype, layout or
non-finite values; and the sampler's draws from the values themselves."""

from __future__ import annotations

import pytest
import torch

from torchlens.train.measure import exact
from torchlens.train.measure.exact import SMALL, measure
from torchlens.web.exact import EXACT_FIELDS, exact_summary


def _reference(x: torch.Tensor) -> dict:
    """The fields computed in float64 by torch, for finite values only (as the explorer defines them)."""
    d = x.detach().reshape(-1).double()
    finite = d[torch.isfinite(d)]
    mean = finite.mean().item() if finite.numel() else float("nan")
    return {
        "finite": finite.numel(),
        "mean": mean,
        "m2": ((finite - mean) ** 2).sum().item() if finite.numel() else 0.0,
        "min": finite.min().item() if finite.numel() else float("nan"),
        "max": finite.max().item() if finite.numel() else float("nan"),
        "nan": int(torch.isnan(d).sum()),
        "posinf": int((d == float("inf")).sum()),
        "neginf": int((d == -float("inf")).sum()),
        "zeros": int((d == 0).sum()),
    }


def _check(x: torch.Tensor) -> None:
    got = dict(zip(EXACT_FIELDS, exact_summary(x).tolist()))
    want = _reference(x)
    for field in ("finite", "min", "max", "nan", "posinf", "neginf", "zeros"):
        assert got[field] == want[field] or (got[field] != got[field] and want[field] != want[field]), field
    rel = 1e-12 if x.dtype == torch.float64 else 1e-6
    scale = abs(want["mean"]) + (want["m2"] / max(want["finite"], 1)) ** 0.5  # of the values' size
    assert got["mean"] == pytest.approx(want["mean"], abs=rel * scale + 1e-30)
    assert got["m2"] == pytest.approx(want["m2"], rel=rel * 10, abs=1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 63, 64, 65, 513, 1024 + 5, 2048 + 63, 100_003])
def test_counts_extremes_and_moments_match_torch(dtype: torch.dtype, n: int):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, generator=g, dtype=torch.float64) * 3 + 2).to(dtype)
    x[:: max(1, n // 5)] = 0.0
    x[1::9] = -0.0  # a negative zero is a zero too
    _check(x)


def test_the_values_measured_are_the_tensors_own():
    base = torch.randn(4, SMALL, generator=torch.Generator().manual_seed(1))
    _check(base[2])  # a view at an offset into its storage
    _check(base[:, ::3])  # not contiguous: measured from a contiguous copy
    image = torch.randn(2, 8, 32, 32).to(memory_format=torch.channels_last)
    _check(image)
    _check(base[1, ::3])  # a strided 1-D view: its own values, not its storage's next ones
    _check(torch.tensor([2.5]).expand(SMALL * 2))  # stride 0: one value repeated
    _check(torch.randn(SMALL * 2, dtype=torch.float16))  # half precision: measured in float32
    _check(torch.randn(SMALL * 2).to(torch.bfloat16))


def test_a_spread_small_next_to_the_mean_is_measured_about_the_mean():
    x = torch.full((200_000,), 1.0e4) + torch.randn(200_000, generator=torch.Generator().manual_seed(2)) * 1e-3
    x[0] = 0.5  # a first value far from the others: the first shift cancels badly
    _check(x)
    _check(torch.zeros(50_000))  # constant: no spread at all
    _check(torch.full((50_000,), -3.5, dtype=torch.float64))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [0, 5, SMALL * 2 - 1])
def test_a_value_that_is_not_finite_takes_the_careful_path(bad: float, where: int):
    x = torch.randn(SMALL * 2, generator=torch.Generator().manual_seed(3))
    x[where] = bad
    x[7] = 0.0
    _check(x)


def test_overflowing_squares_take_the_careful_path():
    x = torch.tensor([3e38, -3e38, 1.0] * 1000)  # finite values whose squares overflow float32
    _check(x)
    _check(torch.tensor([1e200, -1e200, 1.0] * 1000, dtype=torch.float64))  # and float64


def test_a_large_float_cpu_tensor_is_copied_and_measured_later():
    pool = exact.CopyPool(limit=1 << 26)
    x = torch.randn(SMALL * 4)
    lazy = measure(x, pool=pool)
    assert isinstance(lazy, exact.LazySummary) and pool.owned == x.numel() * 4
    x.fill_(float("nan"))  # copied when seen: a later in-place change does not reach it
    exact.LazySummary.resolve([lazy])
    assert lazy.summary is not None and lazy.summary[5].item() == 0 and lazy.summary[0].item() == SMALL * 4
    full = exact.CopyPool(limit=1024)  # no room in the pool: measured at once
    assert isinstance(measure(torch.randn(SMALL * 2), pool=full), torch.Tensor) and full.owned == 0


class _Sub(torch.Tensor):
    """A tensor subclass, such as a DTensor's local shard."""


def test_a_tensor_subclass_is_measured_by_torch():
    x = torch.randn(SMALL * 2, generator=torch.Generator().manual_seed(5))
    x[3] = 0.0
    sub = x.as_subclass(_Sub)
    got, want = exact_summary(sub), exact_summary(x)
    assert torch.allclose(got.as_subclass(torch.Tensor)[:9].float(), want[:9].float(), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_sample_is_drawn_uniformly_from_the_values_themselves(dtype: torch.dtype):
    from torchlens.train.record.sampling import Sampler

    values = torch.arange(50_000, dtype=dtype)
    sampler = Sampler(100)
    drawn = torch.cat([sampler.values(values) for _ in range(400)])  # 40,000 positions
    assert drawn.dtype == torch.float32 and drawn.numel() == 40_000
    assert torch.equal(drawn, drawn.round()) and drawn.min() >= 0 and drawn.max() < 50_000
    tenths = torch.histc(drawn, bins=10, min=0, max=50_000)  # 4,000 expected in each
    assert tenths.min() > 3_600 and tenths.max() < 4_400
    again = Sampler(100)
    assert torch.equal(again.values(values), Sampler(100).values(values))  # one seed, one stream
    assert not torch.equal(again.values(values), again.values(values))  # the stream moves on


def test_a_difference_is_sampled_at_the_same_positions_of_both_tensors():
    from torchlens.train.record.sampling import Sampler

    before = torch.randn(30_000)
    after = before + torch.arange(30_000.0) * 1e-3  # the change tells each position
    got = Sampler(100).values(after, minus=before)
    positions = (got / 1e-3).round()
    assert torch.allclose(got, positions * 1e-3, atol=1e-5) and positions.unique().numel() > 90


def test_a_strided_tensor_is_sampled_from_its_own_values():
    from torchlens.train.record.sampling import Sampler

    grid = torch.arange(200_000.0).reshape(400, 500)
    got = Sampler(100).values(grid[:, ::2])  # only even numbers belong to the view
    assert torch.equal(got % 2, torch.zeros(100))


@pytest.mark.parametrize("median_line", [False, True])
def test_small_tensors_measured_together_match_torch(median_line: bool):
    """``row_summaries`` (a step's small tensors, measured together: one stack for rows of one
    length, one buffer reduced by segment for rows of several) gives each row what torch's float64
    reductions give it, NaN and infinities planted, in every dtype a small copy has."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, n in enumerate([1, 2, 3, 7, 7, 64, 100, 1000, 1000, 16384]):
        dtype = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool][i % 6]
        x = torch.randn(n, generator=g) * 10
        if dtype.is_floating_point and n > 3:
            x[: n // 4] = float("nan")
            x[n // 4 : n // 3] = float("inf") if i % 2 else -float("inf")
        x[-1] = 0.0
        rows.append(x.to(dtype) if dtype != torch.bool else x > 0)
    rows.append(torch.full((5,), float("nan")))  # no finite value
    found = exact.row_summaries(rows, median_line=median_line)
    for x, row in zip(rows, found):
        got, want = dict(zip(EXACT_FIELDS, row.tolist())), _reference(x)
        for field, value in want.items():
            assert got[field] == pytest.approx(value, rel=1e-12, abs=1e-9, nan_ok=True), (x.dtype, x.numel(), field)
        median = x.double().nanmedian().item() if median_line else float("nan")
        assert got["line"] == pytest.approx(median, nan_ok=True)
