"""tl.watch under torch.distributed: the ranks' series add up to the global batch's
(torchlens/train/measure/distributed.py). Two gloo ranks on loopback, started by the test, each bounded
in time (a short process-group timeout: a bug shows as an error, not a hang)."""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchlens.train.measure.distributed import RankGroup, RankMismatchError
from torchlens.web.exact import exact_summary
from torchlens.web.stats import histograms

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
slow = pytest.mark.slow  # two spawned processes: about 20 s each on a shared 2-core machine


def _leave_together(out: str, rank: int, world: int, seconds: float = 30.0) -> None:
    """Wait (bounded) until every rank has written its result, without a collective: after a
    mismatch a rank that tears its gloo group down while a peer still uses it can abort the peer."""
    import time

    open(f"{out}.left{rank}", "w").close()
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(f"{out}.left{r}") for r in range(world)) and time.monotonic() < deadline:
        time.sleep(0.02)


def _leave(out: str, rank: int, world: int) -> None:
    """Leave the process group once every rank is done with it (``_leave_together``)."""
    _leave_together(out, rank, world)
    dist.destroy_process_group()


def _samples(rank: int, world: int) -> list:
    """Each rank's share of three series (one with a nan, one constant, one empty on a rank)."""
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(64, generator=g), torch.rand(40, generator=g) * 10, torch.full((8,), 3.0)]
    full[1][5] = float("nan")
    return [t.chunk(world)[rank].clone() for t in full]


def _worker(rank: int, world: int, init: str, out: str, case: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
    )
    try:
        group = RankGroup(
            torch.nn.Linear(2, 2) if case != "structure" or rank == 0 else torch.nn.Linear(3, 2), dist.group.WORLD
        )
        samples = _samples(rank, world)
        keys = [("a:1", "io", "output 0"), ("b:1", "io", "output 0"), ("c:1", "io_grad", "input 0")]
        if case == "branch" and rank == 1:  # a module that ran on this rank only
            samples, keys = samples + [torch.ones(3)], keys + [("d:1", "io", "output 0")]
        result = None
        try:
            h = group.histograms(samples, 0.0, [exact_summary(s) for s in samples], 4, keys)
            result = (h.counts, h.lo, h.hi, h.nonfinite, h.exact, group.collectives)
        except RankMismatchError as error:
            result = ("error", str(error))
        with open(f"{out}.{rank}", "wb") as f:
            pickle.dump(result, f)
    finally:
        _leave(out, rank, world)


def _run(case: str) -> list:
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "init")
        out = os.path.join(d, "out")
        mp.start_processes(_worker, args=(2, init, out, case), nprocs=2, join=True, start_method="spawn")
        results = []
        for r in range(2):
            with open(f"{out}.{r}", "rb") as f:
                results.append(pickle.load(f))
        return results


@slow
def test_two_ranks_give_the_counts_of_one_process_on_the_whole_batch():
    rank0, _ = _run("same")
    whole = [torch.cat([a, b]) for a, b in zip(_samples(0, 2), _samples(1, 2))]
    one = histograms(whole, 0.0, summaries=[exact_summary(s) for s in whole])
    counts, lo, hi, nonfinite, exact, collectives = rank0
    np.testing.assert_array_equal(counts, one.counts)
    np.testing.assert_array_equal(lo, one.lo)
    np.testing.assert_array_equal(hi, one.hi)
    np.testing.assert_array_equal(nonfinite, one.nonfinite)
    # exact statistics over both ranks: counts, min, max, nan/inf/zero counts exactly; mean, m2 to rounding
    np.testing.assert_array_equal(exact[:, [0, 3, 4, 5, 6, 7, 8]], one.exact[:, [0, 3, 4, 5, 6, 7, 8]])
    np.testing.assert_allclose(exact[:, 1:3], one.exact[:, 1:3], rtol=1e-6)  # float32 sums
    assert collectives == 3  # a constant number per logged step, whatever the number of series


@slow
@pytest.mark.parametrize("case", ["branch", "structure"])
def test_ranks_that_differ_all_raise(case):
    results = _run(case)
    assert all(r[0] == "error" for r in results), results
    assert ("set of series" if case == "branch" else "module structure") in results[0][1]


def _exact_model() -> torch.nn.Module:
    """float64 weights and data on a grid of eighths: every sum is exact, so the DDP run and the
    single process compute bit for bit the same values (DDP's averaged gradient is the single
    process's sum halved exactly: the same bins)."""
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-8, 9, p.shape, generator=g).double() / 8)
    return model


def _batch(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(-16, 17, (16, 4), generator=g).double() / 8


# every value binned, and the data's gradient too (its strip counts the global batch as well)
_EXACT_WATCH = dict(backend=None, verbose=False, sample_n=None, reject_outlier_proportion=0, input_grads=True)


def _ddp_worker(rank: int, world: int, init: str, out: str) -> None:
    import torchlens as tl

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        model = torch.nn.parallel.DistributedDataParallel(_exact_model())
        w = tl.watch(model, run_dir=out + ".run", **_EXACT_WATCH)
        for step in range(3):
            model(_batch(step).chunk(world)[rank]).sum().backward()
            model.zero_grad(set_to_none=True)  # .grad was read when the backward pass ended
        w.close()
        with open(f"{out}.{rank}", "wb") as f:
            pickle.dump((w.run_dir, w._ranks.collectives), f)
    finally:
        _leave(out, rank, world)


def _series(run_dir: str) -> dict:
    import torchlens as tl

    run = tl.open_run(run_dir)
    return {key: run.series(*key) for key in run.series_names()}


@slow
def test_ddp_watch_counts_the_global_batch(tmp_path):
    import torchlens as tl

    out = str(tmp_path / "ddp")
    mp.start_processes(_ddp_worker, args=(2, "file://" + str(tmp_path / "init"), out), nprocs=2, start_method="spawn")
    results = [pickle.load(open(f"{out}.{r}", "rb")) for r in range(2)]
    assert results[0][0] == out + ".run" and results[1][0] is None  # rank 0 writes
    assert results[0][1] == results[1][1] == 3 * 3  # 3 collectives per logged step written
    model = _exact_model()
    w = tl.watch(model, run_dir=str(tmp_path / "one"), **_EXACT_WATCH)
    for step in range(3):
        model(_batch(step)).sum().backward()
        model.zero_grad(set_to_none=True)
    w.close()
    ddp, one = _series(out + ".run"), _series(w.run_dir)
    assert sorted(ddp) == sorted(one)
    kinds = {k[1] for k in one}
    assert kinds >= {"io", "io_grad", "params", "params_grad"}
    assert one[("", "io_grad", "input 0")].counts.sum() > 0  # the data's strip is compared too
    for key in one:
        np.testing.assert_array_equal(ddp[key].counts, one[key].counts, err_msg=str(key))
        scale = 0.5 if key[1] == "params_grad" else 1.0  # DDP's gradient is the mean of the ranks'
        np.testing.assert_array_equal(np.asarray(ddp[key].min), np.asarray(one[key].min) * scale, err_msg=str(key))
        np.testing.assert_array_equal(np.asarray(ddp[key].max), np.asarray(one[key].max) * scale, err_msg=str(key))


def _fsdp_worker(rank: int, world: int, init: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import torchlens as tl

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        model = _exact_model()
        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model[0], mesh=mesh)  # its weight and bias become DTensors, sharded over the ranks
        fully_shard(model, mesh=mesh)
        w = tl.watch(
            model, run_dir=out + ".run", backend=None, verbose=False, sample_n=None, reject_outlier_proportion=0
        )
        for step in range(2):
            model(_batch(step).chunk(world)[rank]).sum().backward()
            model.zero_grad(set_to_none=True)
        w.close()
    finally:
        _leave(out, rank, world)


@slow
def test_fsdp2_sharded_parameters_describe_the_full_parameter(tmp_path):
    """FSDP2 on gloo: a sharded parameter's params_grad is made of the ranks' shards (summed
    counts, no gather), and equals the single process's (halved: FSDP averages)."""
    import torchlens as tl

    pytest.importorskip("torch.distributed.fsdp")
    out = str(tmp_path / "fsdp")
    mp.start_processes(_fsdp_worker, args=(2, "file://" + str(tmp_path / "init"), out), nprocs=2, start_method="spawn")
    model = _exact_model()
    w = tl.watch(
        model, run_dir=str(tmp_path / "one"), backend=None, verbose=False, sample_n=None, reject_outlier_proportion=0
    )
    for step in range(2):
        model(_batch(step)).sum().backward()
        model.zero_grad(set_to_none=True)
    w.close()
    fsdp, one = _series(out + ".run"), _series(w.run_dir)
    checked = list(one)  # the root group's parameters (2:1) too
    assert ("0:1", "params_grad", "weight") in checked
    for key in checked:
        assert key in fsdp, key
        assert fsdp[key].steps.tolist() == one[key].steps.tolist(), (key, fsdp[key].steps, fsdp[key].reason)
        np.testing.assert_array_equal(fsdp[key].counts, one[key].counts, err_msg=str(key))
        scale = 0.5 if key[1] == "params_grad" else 1.0
        np.testing.assert_array_equal(np.asarray(fsdp[key].max), np.asarray(one[key].max) * scale, err_msg=str(key))


def test_ddp_model_without_a_process_group_is_a_clear_error(tmp_path):
    import torchlens as tl

    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "init"), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    finally:
        dist.destroy_process_group()
    with pytest.raises(tl.RankMismatchError, match="no process group is initialised"):
        tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False)
    assert not (tmp_path / "run").exists()


class _Branchy(torch.nn.Module):
    """A model that takes an extra submodule on rank 1 only."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        return self.b(x) if dist.get_rank() == 1 else x * 1.0


def _branch_worker(rank: int, world: int, init: str, out: str) -> None:
    import torchlens as tl

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
    )
    try:
        model = torch.nn.parallel.DistributedDataParallel(_Branchy(), find_unused_parameters=True)
        w = tl.watch(model, run_dir=out + ".run", backend=None, verbose=False)
        error = None
        try:
            model(torch.randn(4, 4)).sum().backward()
            model(torch.randn(4, 4)).sum().backward()
        except tl.RankMismatchError as e:
            error = str(e)
        finally:
            try:
                w.close()
            except tl.RankMismatchError:
                pass
        with open(f"{out}.{rank}", "wb") as f:
            pickle.dump(error, f)
    finally:
        _leave(out, rank, world)


@slow
def test_a_branch_on_one_rank_stops_every_rank_with_a_clear_error(tmp_path):
    out = str(tmp_path / "branch")
    mp.start_processes(
        _branch_worker, args=(2, "file://" + str(tmp_path / "init"), out), nprocs=2, start_method="spawn"
    )
    errors = [pickle.load(open(f"{out}.{r}", "rb")) for r in range(2)]
    assert all(e and "set of series" in e and "logged step 0" in e for e in errors), errors


class _RootNet(torch.nn.Module):
    """Takes the square root of its input: a negative input makes NaN. With ``aside`` the root
    is a second output the loss does not use (no gradient carries the NaN to the other rank);
    otherwise it feeds the linear layer (DDP's gradient all-reduce spreads it to every rank)."""

    def __init__(self, aside: bool) -> None:
        super().__init__()
        self.lin, self.aside = torch.nn.Linear(4, 2), aside

    def forward(self, x: torch.Tensor) -> object:
        if self.aside:
            return self.lin(x), x.detach().sqrt()
        return self.lin(x.sqrt())


NAN_STEP = 2  # one rank's input holds a negative value at this step only
# (on_nonfinite, NaN aside from the gradients, the rank whose input makes it)
SCENARIOS = [("raise", True, 0), ("raise", False, 0), ("warn", True, 0), ("trace", False, 1), ("trace", True, 1)]


def _nan_worker(rank: int, world: int, init: str, out: str) -> None:
    import json
    import warnings

    import torchlens as tl

    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
    )
    results = {}
    try:
        for mode, aside, culprit in SCENARIOS:
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(_RootNet(aside))
            run_dir = f"{out}.{mode}{int(aside)}{culprit}.run"
            w = tl.watch(model, run_dir=run_dir, backend=None, verbose=False, on_nonfinite=mode)
            stopped, steps = None, 0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    for step in range(5):
                        x = torch.rand(8, 4, generator=torch.Generator().manual_seed(10 * step + rank)) + 0.1
                        if rank == culprit and step == NAN_STEP:
                            x[0, 0] = -1.0
                        output = model(x)
                        (output[0] if aside else output).sum().backward()
                        model.zero_grad(set_to_none=True)
                        steps += 1
                except tl.NonfiniteError as error:
                    stopped = (step, str(error))
                finally:
                    w.close()
            said = [str(c.message) for c in caught if issubclass(c.category, tl.NonfiniteWarning)]
            events = None
            if w.run_dir and os.path.exists(os.path.join(w.run_dir, "nonfinite.json")):
                events = json.load(open(os.path.join(w.run_dir, "nonfinite.json")))["events"]
            results[(mode, aside, culprit)] = (stopped, steps, said, events)
    finally:
        with open(f"{out}.{rank}", "wb") as f:
            pickle.dump(results, f)
        _leave(out, rank, world)


@slow
def test_a_nan_on_one_rank_stops_or_warns_every_rank_at_the_same_step(tmp_path):
    out = str(tmp_path / "nan")
    mp.start_processes(_nan_worker, args=(2, "file://" + str(tmp_path / "init"), out), nprocs=2, start_method="spawn")
    ranks = [pickle.load(open(f"{out}.{r}", "rb")) for r in range(2)]
    for scenario in SCENARIOS:
        assert all(scenario in r for r in ranks), (scenario, ranks)
    for aside in (True, False):  # raise: both ranks stop at the NaN step, with the same message
        (s0, n0, _, events), (s1, n1, _, _) = ranks[0][("raise", aside, 0)], ranks[1][("raise", aside, 0)]
        assert s0 is not None and s1 is not None and s0[0] == s1[0] == NAN_STEP, (aside, s0, s1)
        assert n0 == n1 == NAN_STEP
        assert s0[1] == s1[1] and "on rank 0" in s0[1]
        assert events[0]["step"] == NAN_STEP and events[0]["rank"] == 0
    # warn: training goes on everywhere; rank 0 warns once, the others stay silent
    (s0, n0, said0, events), (s1, n1, said1, _) = ranks[0][("warn", True, 0)], ranks[1][("warn", True, 0)]
    assert s0 is s1 is None and n0 == n1 == 5
    assert len(said0) == 1 and f"step {NAN_STEP}" in said0[0] and said1 == []
    assert events[0]["phase"] == "forward" and events[0]["rank"] == 0
    # trace: the rank whose input made the NaN re-runs its step alone (no collective) and names
    # the op; rank 0 writes that rank's event and warns
    for aside, culprit in ((False, 1), (True, 1)):  # spread: its own values decide, not the gradients
        (s0, n0, said0, events), (s1, n1, said1, _) = (
            ranks[0][("trace", aside, culprit)],
            ranks[1][("trace", aside, culprit)],
        )
        assert s0 is s1 is None and n0 == n1 == 5
        assert len(said0) == 1 and f"on rank {culprit}" in said0[0] and said1 == []
        event = events[0]
        assert event["step"] == NAN_STEP and event["rank"] == culprit and event["phase"] == "forward"
        assert event["report"]["found"] and "sqrt" in event["report"]["label"], event


def test_the_ranks_nonfinite_decision_names_the_rank_whose_own_values_went_bad(tmp_path):
    """One number decides for all ranks: own values (outputs, their gradients) before the
    parameters' gradients (averaged under DDP, so non-finite everywhere at once)."""
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "init"), rank=0, world_size=1)
    try:
        group = RankGroup(torch.nn.Linear(2, 2), dist.group.WORLD)
        yes, no = torch.tensor(True), torch.tensor(False)
        assert group.first_nonfinite(yes, yes) is None and group.first_nonfinite(None, None) is None
        assert group.first_nonfinite(no, yes) == 0 and group.first_nonfinite(yes, no) == 0
        assert group.first_nonfinite(None, no) == 0 and group.first_nonfinite(no, None) == 0
        assert group.collectives == 6  # one each
    finally:
        dist.destroy_process_group()
