"""Large CPU tensors of a logged step are copied into the watch's CopyPool and measured later, on
the writer thread: the same statistics as measuring at once, within a memory limit."""

from __future__ import annotations

import gc

import torch

from torchlens.train.measure.exact import SMALL, CopyPool, LazySummary, measure
from torchlens.web.exact import exact_summary


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))  # the line field is NaN in both


def _large(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SMALL * 4, generator=g)
    x[::7] = 0.0
    x[::11] = -0.0
    return x


def test_a_copy_measured_later_gives_the_summary_of_the_values_when_copied():
    pool = CopyPool(limit=1 << 24)
    x = _large()
    expected = exact_summary(x)
    lazy = measure(x, pool=pool)
    assert isinstance(lazy, LazySummary) and not lazy.measured
    x.fill_(float("nan"))  # an in-place change after the copy does not reach the statistics
    LazySummary.resolve([lazy])
    assert _same(lazy.summary, expected)


def test_buffers_are_reused_once_measured_and_the_limit_holds():
    x = _large()
    pool = CopyPool(limit=2 * x.numel() * x.element_size())
    first, second = measure(x, pool=pool), measure(x, pool=pool)
    assert isinstance(first, LazySummary) and isinstance(second, LazySummary)
    addresses = {first.values.data_ptr(), second.values.data_ptr()}
    over = measure(x, pool=pool)  # a third copy would pass the limit: measured at once
    assert isinstance(over, torch.Tensor) and _same(over, exact_summary(x))
    LazySummary.resolve([first, second])
    again = measure(_large(1), pool=pool)  # the next step's copy goes into a measured one's buffer
    assert isinstance(again, LazySummary) and again.values.data_ptr() in addresses
    assert pool.owned == 2 * x.numel() * x.element_size()


def test_free_buffers_of_other_sizes_make_room_and_dropped_copies_give_back_their_budget():
    pool = CopyPool(limit=SMALL * 4 * 4)
    lazy = measure(_large(), pool=pool)
    LazySummary.resolve([lazy])  # its buffer is free now
    other = measure(torch.randn(SMALL * 3), pool=pool)  # another size: the free buffer is dropped
    assert isinstance(other, LazySummary) and pool.owned == SMALL * 3 * 4
    del other  # never measured (a step that was abandoned): its buffer goes, and its budget
    gc.collect()
    assert pool.owned == 0


def test_small_complex_and_integer_tensors_are_not_copied_into_the_pool():
    pool = CopyPool(limit=1 << 24)
    small = measure(torch.randn(100), pool=pool)
    assert isinstance(small, LazySummary) and pool.owned == 0  # small ones: their own copy
    assert measure(torch.randn(SMALL + 1, dtype=torch.complex64), pool=pool) is None
    ints = measure(torch.arange(SMALL * 2), pool=pool)
    LazySummary.resolve([ints])
    assert ints.summary[1].item() == (SMALL * 2 - 1) / 2
