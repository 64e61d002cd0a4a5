"""Outlier rejection of a step's samples, all lengths at once (``web/stats.py``): the same
histograms as rejecting sample by sample, in a number of operations that does not grow with
the number of distinct lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torchlens.web.stats import histograms, reject_outliers


def _samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        s = torch.randn(n, generator=g) * (1 + n % 7) + n % 3
        if n > 20:
            s[n // 2] = 1e6  # an outlier
        if n % 5 == 0 and n > 1:
            s[1] = float("nan")
        if n % 11 == 0 and n > 0:
            s[0] = float("-inf")
        out.append(s)
    return out


@pytest.mark.parametrize("proportion", [0.1, 0.3])
def test_rejecting_all_lengths_together_bins_as_rejecting_each_sample(proportion: float):
    lengths = [1, 2, 3, 5, 9, 10, 17, 33, 64, 100, 100, 100, 250, 1000, 1024, 1025, 0, 7]
    samples = _samples(lengths)
    together = histograms(samples, proportion)
    one_by_one = histograms(reject_outliers(samples, proportion), 0.0)
    np.testing.assert_array_equal(together.counts, one_by_one.counts)
    np.testing.assert_array_equal(together.lo, one_by_one.lo)
    np.testing.assert_array_equal(together.hi, one_by_one.hi)
    np.testing.assert_allclose(together.sums, one_by_one.sums, rtol=1e-12)
    np.testing.assert_allclose(together.sums_of_squares, one_by_one.sums_of_squares, rtol=1e-12)
    # the non-finite values are counted before rejection, as before
    assert together.nonfinite.tolist() == [int((~torch.isfinite(s)).sum()) for s in samples]


def _ops(samples) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        histograms(samples, 0.1)
    return sum(e.name.startswith("aten::") for e in prof.events())


def test_the_operations_of_rejection_do_not_grow_with_the_number_of_lengths():
    few = _ops(_samples([100] * 40))
    many = _ops(_samples([100] * 20 + list(range(65, 85))))  # 21 lengths, all rounding up to 128
    assert many <= few + 10, (few, many)
