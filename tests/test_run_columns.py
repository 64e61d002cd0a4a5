"""Merging stored columns of a long run (torchlens/train/store/columns.py) and the writer that
uses it: all pairs at once give what merging one pair at a time gives, and a run longer than
``max_columns`` keeps every step it was given."""

import numpy as np
import pytest

from torchlens.train.store import RunWriter
from torchlens.train.store.columns import EXACT_COLUMNS, combine_columns, compact_columns
from torchlens.web.exact import EXACT_FIELDS

BINS = 8


def _row(rng, sid, slot, kind):
    """A random stored column: ``kind`` 'plain', 'point' (all values at one point), 'empty' (no
    finite value: no range), 'unrecorded' (no statistics over all values)."""
    counts = rng.integers(0, 20, BINS).astype(np.float32)
    lo = float(rng.normal())
    hi = lo if kind == "point" else lo + float(rng.uniform(0.1, 3))
    n = float(counts.sum())
    nan, posinf, neginf, zeros = (float(v) for v in rng.integers(0, 3, 4))
    finite = n
    exact = (
        finite + nan + posinf + neginf,
        lo,
        hi,
        (lo + hi) / 2,
        float(rng.uniform(0, 1)),
        nan,
        posinf,
        neginf,
        zeros,
    )
    line = float(rng.uniform()) if rng.random() < 0.8 else None
    exact += (line,)
    if kind == "empty":
        lo = hi = None
        counts[:] = 0
        exact = (nan + posinf, None, None, None, None, nan, posinf, 0.0, 0.0, None)
    if kind == "unrecorded":
        exact = (None,) * len(EXACT_COLUMNS)
    step = int(rng.integers(0, 100))
    return (
        sid,
        slot,
        step,
        step + int(rng.integers(0, 3)),
        int(rng.integers(1, 4)),
        lo,
        hi,
        0,
        counts.tobytes(),
        *exact,
    )


def _nan(v):
    return float("nan") if v is None else float(v)


def _reference(a, b):
    """One pair merged the plain way: np.interp of each cumulative histogram over the union of
    the ranges, and the pooled statistics written out field by field."""
    parts = [(_nan(r[5]), _nan(r[6]), np.frombuffer(r[8], np.float32)) for r in (a, b) if r[5] is not None]
    if parts:
        lo, hi = min(p[0] for p in parts), max(p[1] for p in parts)
        edges = np.linspace(lo, hi, BINS + 1)
        total = np.zeros(BINS)
        for p_lo, p_hi, c in parts:
            if p_hi <= p_lo or hi <= lo:
                total[0 if hi <= lo else min(int((p_lo - lo) / (hi - lo) * BINS), BINS - 1)] += c.sum()
            else:
                cumulative = np.concatenate([[0.0], np.cumsum(c, dtype=np.float64)])
                total += np.diff(np.interp(edges, np.linspace(p_lo, p_hi, BINS + 1), cumulative))
    else:
        lo = hi = float("nan")
        total = np.frombuffer(a[8], np.float32) + np.frombuffer(b[8], np.float32)
    x = dict(zip(EXACT_COLUMNS, map(_nan, a[9:])))
    y = dict(zip(EXACT_COLUMNS, map(_nan, b[9:])))
    if not np.isfinite(x["count"]) or not np.isfinite(y["count"]):
        exact = x if np.isfinite(x["count"]) else y
    else:
        exact = {k: x[k] + y[k] for k in ("count", "nan", "posinf", "neginf", "zeros")}
        n_x = x["count"] - x["nan"] - x["posinf"] - x["neginf"]
        n_y = y["count"] - y["nan"] - y["posinf"] - y["neginf"]
        n = n_x + n_y
        exact["true_min"] = np.fmin(x["true_min"], y["true_min"]) if n else np.nan
        exact["true_max"] = np.fmax(x["true_max"], y["true_max"]) if n else np.nan
        if n:
            mx, my = np.nan_to_num(x["mean"]), np.nan_to_num(y["mean"])
            mean = (mx * n_x + my * n_y) / n
            spread = n_x * (np.nan_to_num(x["std"]) ** 2 + (mx - mean) ** 2)
            spread += n_y * (np.nan_to_num(y["std"]) ** 2 + (my - mean) ** 2)
            exact["mean"], exact["std"] = mean, np.sqrt(spread / n)
        else:
            exact["mean"] = exact["std"] = np.nan
        lines = [(v, w) for v, w in ((x["line"], a[4]), (y["line"], b[4])) if np.isfinite(v)]
        exact["line"] = sum(v * w for v, w in lines) / sum(w for _, w in lines) if lines else np.nan
    head = (a[0], a[1], min(a[2], b[2]), max(a[3], b[3]), a[4] + b[4], lo, hi, a[7] + b[7])
    return head, total, [exact[k] for k in EXACT_COLUMNS]


def _same(row, expected):
    head, counts, exact = expected
    assert row[:5] == head[:5] and row[7] == head[7]
    np.testing.assert_allclose([_nan(row[5]), _nan(row[6])], head[5:7], rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(np.frombuffer(row[8], np.float32), counts, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose([_nan(v) for v in row[9:]], exact, rtol=1e-12, atol=1e-12, equal_nan=True)


KINDS = ("plain", "point", "empty", "unrecorded")


def test_all_pairs_at_once_equal_one_pair_at_a_time():
    rng = np.random.default_rng(0)
    pairs = [
        (_row(rng, i, 0, KINDS[i % 4]), _row(rng, i, 1, KINDS[(i // 4) % 4]))
        for i in range(4 * 4 * 8)  # every combination of kinds, several times
    ]
    merged = combine_columns([a for a, _ in pairs], [b for _, b in pairs], BINS)
    assert len(merged) == len(pairs)
    for row, (a, b) in zip(merged, pairs):
        _same(row, _reference(a, b))
        assert sum(np.frombuffer(row[8], np.float32)) == pytest.approx(
            sum(np.frombuffer(r[8], np.float32).sum() for r in (a, b) if r[5] is not None or a[5] is None)
        )


def test_histograms_of_one_range_add_up_and_statistics_pool_exactly():
    """Two steps' values with the same range: the merged histogram is the sum, the merged
    mean and std those of all values together."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=500), rng.normal(2, 3, size=300)
    lo, hi = min(x.min(), y.min()), max(x.max(), y.max())

    def column(values, step):
        counts, _ = np.histogram(values, BINS, (lo, hi))
        exact = (len(values), values.min(), values.max(), values.mean(), values.std(), 0, 0, 0, 0, values.std())
        return (3, 0, step, step, 1, lo, hi, 0, counts.astype(np.float32).tobytes(), *map(float, exact))

    row = combine_columns([column(x, 0)], [column(y, 1)], BINS)[0]
    both = np.concatenate([x, y])
    assert np.frombuffer(row[8], np.float32).tolist() == np.histogram(both, BINS, (lo, hi))[0].tolist()
    got = dict(zip(EXACT_COLUMNS, row[9:]))
    assert got["count"] == 800 and got["true_min"] == both.min() and got["true_max"] == both.max()
    assert got["mean"] == pytest.approx(both.mean(), rel=1e-12)
    assert got["std"] == pytest.approx(both.std(), rel=1e-12)
    assert got["line"] == pytest.approx((x.std() + y.std()) / 2)


def test_compaction_merges_neighbouring_slots_of_each_series():
    rng = np.random.default_rng(2)
    rows = [
        _row(rng, sid, slot, KINDS[(sid + slot) % 4]) for sid in (1, 2, 5) for slot in range(5) if (sid, slot) != (2, 2)
    ]
    compacted = compact_columns(rows[::-1], BINS)  # in any order
    by_place = {(r[0], r[1]): r for r in rows}
    expected = []
    for sid in (1, 2, 5):
        for k in range(3):
            here = [(sid, k, *by_place[p][2:]) for p in ((sid, 2 * k), (sid, 2 * k + 1)) if p in by_place]
            expected.append(((sid, k), here))
    assert [(r[0], r[1]) for r in compacted] == [place for place, _ in expected]
    for row, (place, here) in zip(compacted, expected):
        if len(here) == 2:
            _same(row, _reference(*here))
        else:  # alone: moved, unchanged
            assert row == here[0]


@pytest.mark.parametrize("max_columns", [3, 4, 5])
def test_a_long_run_keeps_every_step_and_a_rewritten_step_once(tmp_path, max_columns):
    """More steps than columns (an odd number of columns leaves the next step in a merged
    column), each step written twice as a watch does (backward, then the optimizer's updates),
    one series seen in every third step only: no series ever holds more than ``max_columns``
    columns, every step is counted once, in order, and the pooled mean is that of all values."""
    writer = RunWriter(str(tmp_path), "M", {}, bins=BINS, max_columns=max_columns)
    every = [("lin:1", "io", "output"), ("lin:1", "params", "weight")]
    sometimes = ("lin:1", "io", "input x")
    values = {}
    rng = np.random.default_rng(3)
    for step in range(41):
        keys = every + ([sometimes] if step % 3 == 0 else [])
        for attempt in range(2):  # the second write of a step replaces the first
            data = [rng.normal(step, 1, size=50) for _ in keys]
            values.update(((step, key), d) for key, d in zip(keys, data))
            counts = np.stack([np.histogram(d, BINS, (-5, 50))[0] for d in data]).astype(np.float32)
            exact = np.array([_exact(d) for d in data])
            n = len(keys)
            writer.write_step(step, keys, counts, np.full(n, -5.0), np.full(n, 50.0), np.zeros(n), exact=exact)
            held = writer.db.execute("SELECT COUNT(*) FROM columns GROUP BY series_id").fetchall()
            assert max(n for (n,) in held) <= max_columns
    rows = writer.db.execute("SELECT * FROM columns ORDER BY series_id, slot").fetchall()
    stored_stride = int(writer.db.execute("SELECT value FROM meta WHERE key = 'stride'").fetchone()[0])
    ids = dict(writer.series_ids)
    writer.close()
    assert writer.stride == stored_stride == 16
    for key in every + [sometimes]:
        mine = [r for r in rows if r[0] == ids[key]]
        seen = sorted(step for step, k in values if k == key)
        assert sum(r[4] for r in mine) == len(seen)
        assert mine[0][2] == seen[0] and mine[-1][3] == seen[-1]
        assert all(a[3] < b[2] for a, b in zip(mine, mine[1:]))  # in order, no step twice
        for r in mine:
            steps = [k for k in seen if r[2] <= k <= r[3]]
            assert len(steps) == r[4] and np.frombuffer(r[8], np.float32).sum() == 50 * len(steps)
            everything = np.concatenate([values[(k, key)] for k in steps])
            got = dict(zip(EXACT_COLUMNS, r[9:]))
            assert got["count"] == len(everything)
            assert got["mean"] == pytest.approx(everything.mean(), rel=1e-9)
            assert got["std"] == pytest.approx(everything.std(), rel=1e-9)


def _exact(values):
    """``EXACT_FIELDS`` of finite float values."""
    found = {
        "finite": len(values),
        "mean": values.mean(),
        "m2": ((values - values.mean()) ** 2).sum(),
        "min": values.min(),
        "max": values.max(),
        "nan": 0,
        "posinf": 0,
        "neginf": 0,
        "zeros": 0,
        "line": np.nan,
    }
    return [found[k] for k in EXACT_FIELDS]


def test_since_reads_the_columns_ending_at_or_after_a_step(tmp_path):
    """``series(since=k)`` (a live page catching up) is found through the key (series, slot):
    the same columns as the whole series filtered by their last step, at every stride."""
    import torchlens as tl

    writer = RunWriter(str(tmp_path), "M", {}, bins=BINS, max_columns=4)
    key = ("lin:1", "io", "output")
    for step in range(0, 82, 2):  # steps numbered apart from their ordinals
        counts = np.ones((1, BINS), np.float32)
        writer.write_step(
            step, [key], counts, np.zeros(1), np.ones(1), np.zeros(1), exact=np.array([_exact(np.ones(3))])
        )
        run = tl.open_run(str(tmp_path))
        whole = run.series(*key)
        for since in (-1, 0, 1, step - 3, step - 1, step, step + 1):
            part = run.series(*key, since=since)
            keep = whole.last_steps >= since
            assert part.steps.tolist() == whole.steps[keep].tolist()
            assert part.num_steps.tolist() == whole.num_steps[keep].tolist()
    writer.close()
    assert writer.stride == 16


class _Counting:
    """A connection that counts the checkpoints asked of it."""

    def __init__(self, db):
        self.db, self.checkpoints = db, 0

    def execute(self, sql, *args):
        self.checkpoints += "wal_checkpoint" in sql
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)

    def __enter__(self):
        return self.db.__enter__()

    def __exit__(self, *exc):
        return self.db.__exit__(*exc)


@pytest.mark.parametrize("series", [4, 432])
def test_the_log_is_copied_back_every_few_thousand_pages(tmp_path, series):
    """``checkpoint`` (called by the watch once a step, while training does not wait) copies the
    log back once it holds about ``CHECKPOINT_PAGES`` pages: rarely for a small run, about every
    fourth step for 432 series; the log never grows to sqlite's own threshold."""
    from torchlens.train.store.database import CHECKPOINT_PAGES, DB_NAME

    writer = RunWriter(str(tmp_path), "M", {}, bins=BINS)
    counting = writer.db = _Counting(writer.db)
    keys = [(f"m{i}:1", "io", "output") for i in range(series)]
    steps = 40
    for step in range(steps):
        counts = np.ones((series, BINS), np.float32)
        exact = np.array([_exact(np.ones(3))] * series)
        writer.write_step(step, keys, counts, np.zeros(series), np.ones(series), np.zeros(series), exact=exact)
        writer.checkpoint()
    per_commit = writer.log_pages_per_commit
    writer.db = counting.db
    wal = (tmp_path / (DB_NAME + "-wal")).stat().st_size if (tmp_path / (DB_NAME + "-wal")).exists() else 0
    writer.close()
    assert 1 <= counting.checkpoints <= 1 + steps * per_commit / CHECKPOINT_PAGES + 1
    assert wal <= (CHECKPOINT_PAGES + 2 * per_commit) * (4096 + 24) + 32
