"""Training health: the NaN sentinel (tl.watch(on_nonfinite=...)) and run.health()."""

from __future__ import annotations

import copy
import json
import os
import types
import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.train.health.sentinel import EVENTS_FILE, DivergenceWarning, NonfiniteWarning

BAD_STEP = 5


class LogAct(nn.Module):
    def forward(self, x):
        return torch.log(x)  # NaN where x < 0: THE LOG LINE


class SqrtAbs(nn.Module):
    def forward(self, x):
        return torch.sqrt(x.abs())  # finite forward; at exactly 0 its backward is NaN


class Drift(nn.Module):
    """``act`` (a log) goes NaN once ``inp``'s bias is pushed negative at BAD_STEP."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.act = act
        self.out = nn.Linear(8, 1)
        with torch.no_grad():
            self.inp.weight.uniform_(0.0, 0.1)
            self.inp.bias.fill_(3.0)

    def forward(self, x):
        return self.out(self.act(self.inp(x)))


def _log_line() -> int:
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if "THE LOG LINE" in line and "return" in line)


def _break(model: Drift) -> None:
    with torch.no_grad():
        if isinstance(model.act, LogAct):
            model.inp.bias.fill_(-50.0)
        else:  # exactly zero into sqrt(abs()): finite forward, NaN gradient
            model.inp.weight.zero_()
            model.inp.bias.zero_()


def _train(model: nn.Module, steps: int, on_step=None, opt=None) -> None:
    opt = opt or torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.rand(16, 4, generator=torch.Generator().manual_seed(0))
    for step in range(steps):
        if step == BAD_STEP:
            _break(model)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if on_step is not None:
            on_step(step, model)
        loss.backward()
        opt.step()


def _watch(model, tmp_path, **kw):
    return tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, **kw)


def _events(tmp_path) -> list:
    with open(tmp_path / "run" / EVENTS_FILE, encoding="utf-8") as f:
        return json.load(f)["events"]


@pytest.mark.parametrize("log_freq", [1, 4])  # BAD_STEP logged, and not logged
def test_warn_names_the_step_and_the_call_once(tmp_path, log_freq):
    model = Drift(LogAct())
    with _watch(model, tmp_path, on_nonfinite="warn", log_freq=log_freq):
        with pytest.warns(NonfiniteWarning) as caught:
            _train(model, BAD_STEP + 4)
    assert len(caught) == 1  # one warning, not one per NaN step
    message = str(caught[0].message)
    assert f"step {BAD_STEP} " in message and "'act:1'" in message
    (event,) = _events(tmp_path)
    assert (event["step"], event["call"], event["phase"]) == (BAD_STEP, "act:1", "forward")


def test_backward_nonfinite_names_the_call(tmp_path):
    model = Drift(SqrtAbs())
    with _watch(model, tmp_path, on_nonfinite="warn", log_freq=3):
        with pytest.warns(NonfiniteWarning, match=f"step {BAD_STEP} "):
            _train(model, BAD_STEP + 2)
    (event,) = _events(tmp_path)
    assert (event["step"], event["call"], event["phase"]) == (BAD_STEP, "act:1", "backward")


def test_trace_names_the_operation_and_its_line(tmp_path):
    model = Drift(LogAct())
    with _watch(model, tmp_path, on_nonfinite="trace", log_freq=2):
        with pytest.warns(NonfiniteWarning, match="log_1_"):
            _train(model, BAD_STEP + 2)
    (event,) = _events(tmp_path)
    report = event["report"]
    assert report["phase"] == "forward" and report["label"].startswith("log_") and report["kind"] == "nan"
    assert report["line"] == _log_line() and report["file"] == __file__
    page = tmp_path / "run" / event["page"]
    assert page.is_file() and "non-finite values" in page.read_text(encoding="utf-8")


def test_trace_of_a_backward_nonfinite_uses_the_steps_gradient(tmp_path):
    model = Drift(SqrtAbs())
    with _watch(model, tmp_path, on_nonfinite="trace", log_freq=4):
        with pytest.warns(NonfiniteWarning):
            _train(model, BAD_STEP + 1)
    report = _events(tmp_path)[0]["report"]
    assert report["phase"] == "backward" and report["label"].startswith(("sqrt_", "abs_"))


def test_trace_replays_the_steps_random_state(tmp_path):
    """NaN only when dropout drops the first value: seed 5 drops it in the step and keeps it in
    the next draw, so a rerun that does not start from the step's generator states finds nothing."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return torch.log(self.drop(x)[:1] - 1.0)

    model = nn.Sequential(Masked())
    with _watch(model, tmp_path, on_nonfinite="trace"):
        with pytest.warns(NonfiniteWarning):
            torch.manual_seed(5)
            model(torch.ones(4, requires_grad=True)).sum().backward()
    (event,) = _events(tmp_path)
    assert (event["call"], event["phase"]) == ("0:1", "forward")
    assert event["report"]["found"] and event["report"]["label"].startswith("log_")


def test_raise_after_the_step_is_written_and_leaves_the_model_as_it_was(tmp_path):
    model = Drift(LogAct())
    before = {}

    def snapshot(step, m):
        if step == BAD_STEP:
            before["state"] = copy.deepcopy(m.state_dict())
            before["rng"] = torch.get_rng_state()

    with _watch(model, tmp_path, on_nonfinite="raise", log_freq=1) as w:
        with pytest.raises(tl.NonfiniteError, match=f"step {BAD_STEP} .*'act:1'") as caught:
            _train(model, BAD_STEP + 3, on_step=snapshot)
        assert isinstance(caught.value, tl.TorchlensError) and isinstance(caught.value, FloatingPointError)
        run_dir = w.run_dir
    assert BAD_STEP in tl.open_run(run_dir).steps.tolist()  # written before the error left backward()
    after = model.state_dict()
    assert all(torch.equal(before["state"][k], after[k]) for k in after)  # no optimizer step
    assert torch.equal(torch.get_rng_state(), before["rng"])  # the rerun left the generators as they were
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_healthy_training_is_silent(tmp_path):
    model = Drift(LogAct())
    with _watch(model, tmp_path, on_nonfinite="raise", log_freq=2):
        with torch.no_grad():
            model.inp.bias.fill_(3.0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.rand(16, 4)
        for _ in range(4):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    assert not os.path.exists(tmp_path / "run" / EVENTS_FILE)


def test_a_finite_gradient_whose_float32_norm_overflows_is_divergence_not_nan(tmp_path):
    """A weight gradient of 2e20 is finite (only its float32 norm overflows): the sentinel must not
    call it non-finite; it says that gradients exploded, and where."""
    model = nn.Linear(4, 1)
    with _watch(model, tmp_path, on_nonfinite="trace"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (model(torch.full((2, 4), 1e10)).sum() * 1e10).backward()
    messages = [(w.category, str(w.message)) for w in caught]
    assert [c for c, _ in messages] == [DivergenceWarning], messages  # no NonfiniteWarning
    text = messages[0][1]
    assert "step 0: the gradient norm of 'weight' is 4e+20, past what float32 can square" in text
    assert "every value is still finite" in text
    assert _events(tmp_path) == []  # no non-finite event, so no "every value stayed finite" story under one
    h = tl.open_run(str(tmp_path / "run")).health()
    (row,) = h[h.signal == "exploding"].to_dict("records")
    assert (row["call"], row["series"], row["first_step"]) == ("", "params_grad/weight", 0)


def test_a_gradient_that_grows_a_millionfold_in_two_steps_is_found_before_any_nan(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    x = torch.rand(16, 4)
    with _watch(model, tmp_path, on_nonfinite="warn", log_freq=3):
        with pytest.warns(DivergenceWarning) as caught:
            for scale in (1.0, 1.0, 1e3, 1e7, 1e8):  # the loss's scale runs away from step 2 on
                model.zero_grad()
                (model(x).sum() * scale).backward()
    assert len(caught) == 1  # once per run
    message = str(caught[0].message)
    assert "step 3: the gradient norm of '" in message and "grew 1.0e+07x in 2 step(s)" in message, message
    h = tl.open_run(str(tmp_path / "run")).health()
    assert 3 in h[h.signal == "exploding"].first_step.tolist()


def test_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="on_nonfinite takes one of None, .warn., .raise., .trace."):
        _watch(nn.Linear(2, 2), tmp_path, on_nonfinite="ignore")


# ----- run.health() ---------------------------------------------------------------------------
def _fit(model: nn.Module, tmp_path, steps: int = 6, lr: float = 1e-2, x=None, **kw):
    """Train on a fixed regression batch; the run's health."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(32, 4, generator=gen) if x is None else x
    target = torch.rand(x.shape[0], 1, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with _watch(model, tmp_path, **kw) as w:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), target).backward()
            opt.step()
    return tl.open_run(w.run_dir).health()


def _rows(h, signal):
    return h[h.signal == signal]


def test_health_names_the_nan_step_and_the_producing_call(tmp_path):
    model = Drift(LogAct())
    with _watch(model, tmp_path, log_freq=1) as w:
        _train(model, BAD_STEP + 3)
    h = tl.open_run(w.run_dir).health()
    first = h.iloc[0]  # worst first
    assert (first.signal, first.call, first.first_step) == ("nonfinite", "act:1", BAD_STEP)
    assert first.address == "act"
    assert len(_rows(h, "nonfinite")) == 1  # the producer, not 'out:1' or the model it reached


def test_health_names_the_call_whose_backward_made_the_nan(tmp_path):
    model = Drift(SqrtAbs())  # finite forward, NaN gradient from sqrt(abs(0))
    with _watch(model, tmp_path, log_freq=1) as w:
        _train(model, BAD_STEP + 2)
    first = tl.open_run(w.run_dir).health().iloc[0]
    assert (first.signal, first.call, first.first_step, first.series) == (
        "nonfinite",
        "act:1",
        BAD_STEP,
        "io_grad/input",
    )


def test_health_with_the_sentinel_has_the_operation_and_its_page(tmp_path):
    model = Drift(LogAct())
    with _watch(model, tmp_path, log_freq=4, on_nonfinite="trace") as w:
        with pytest.warns(NonfiniteWarning):
            _train(model, BAD_STEP + 3)
    first = tl.open_run(w.run_dir).health().iloc[0]
    assert (first.signal, first.call, first.first_step) == ("nonfinite", "act:1", BAD_STEP)  # a step not logged
    assert "log_1_" in first.explanation and f"line {_log_line()}" in first.explanation
    assert first.page == f"nonfinite_step{BAD_STEP}.html"


def test_dead_relu_is_found(tmp_path):
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].bias.fill_(-10.0)  # every unit negative before the ReLU: dead
    dead = _rows(_fit(model, tmp_path), "dead")
    assert dead.call.tolist() == ["1:1"] and dead.latest_value.iloc[0] == 1.0 and dead.first_step.iloc[0] == 0


def test_vanishing_gradients_of_a_deep_sigmoid_mlp_are_found(tmp_path):
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [nn.Linear(16, 16), nn.Sigmoid()]
    model = nn.Sequential(nn.Linear(4, 16), *layers, nn.Linear(16, 1))
    h = _fit(model, tmp_path, steps=3)
    vanishing = _rows(h, "vanishing").call.tolist()
    assert "0:1" in vanishing and "1:1" in vanishing  # the first layers get ~nothing back
    assert f"{len(model) - 1}:1" not in vanishing  # the last one gets the loss's gradient
    assert _rows(h, "exploding").empty


def test_saturated_tanh_is_found(tmp_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    with torch.no_grad():
        model[0].weight.fill_(50.0)
    sat = _rows(_fit(model, tmp_path, steps=3), "saturated")
    assert sat.call.tolist() == ["1:1"] and sat.latest_value.iloc[0] >= 0.9


def test_exploding_gradients_are_found_when_one_layer_blows_up(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)], nn.Linear(8, 1))
    x = torch.rand(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with _watch(model, tmp_path) as w:
        for step in range(10):
            if step == 7:  # an lr that exploded in one layer: its weights are now huge
                with torch.no_grad():
                    model[3].weight.mul_(1e5)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    exploding = _rows(tl.open_run(w.run_dir).health(), "exploding")
    # the call that amplifies, not the calls before it that receive the amplified gradient
    assert exploding.call.tolist() == ["3:1"] and exploding.first_step.tolist() == [7]
    assert exploding.series.tolist() == ["io_grad/input 0"]
    assert "its backward multiplies the gradient by" in exploding.explanation.iloc[0]


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)) for _ in range(5))

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1).sum(1, keepdim=True)


def test_the_call_that_amplifies_in_one_of_five_branches_is_found_and_the_others_are_quiet(tmp_path):
    torch.manual_seed(0)
    model = Branches()
    with torch.no_grad():
        model.branches[2][0].weight.mul_(1000.0)
    # the amplifier is the first call: its input gradient is the data's, recorded on request
    h = _fit(model, tmp_path, steps=4, lr=1e-6, x=torch.randn(32, 16), input_grads=True)
    exploding = _rows(h, "exploding")
    assert exploding.call.tolist() == ["branches.2.0:1"], h.to_string()
    assert exploding.first_step.tolist() == [0] and exploding.active.tolist() == [True]
    assert set(h.call) == {"branches.2.0:1"}, h.to_string()  # nothing on the healthy branches


def test_a_healthy_small_cnn_has_no_finding(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 1),
    )
    h = _fit(model, tmp_path, steps=8, x=torch.randn(16, 3, 16, 16))
    assert h.empty, h.to_string()


def _open_file(browser, path):
    """A page on an exported file; the errors it raises are collected."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"file://{path}")
    return context, page, errors


def test_a_healthy_run_s_page_has_a_quiet_health_panel_and_no_carets(browser, tmp_path):
    from torchlens.train.serve import export_html

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 1))
    _fit(model, tmp_path, steps=6, x=torch.randn(16, 3, 8, 8), sample_n=50)
    path = export_html(str(tmp_path / "run"), str(tmp_path / "run.html"))
    context, page, errors = _open_file(browser, path)
    try:
        panel = page.wait_for_selector('[data-role="health"]:not([hidden])')
        assert "no finding" in panel.inner_text() and "clear" in panel.get_attribute("class")  # a green edge
        page.drag_and_drop('[data-node="0:1"]', '[data-role="panels"]')
        strip = page.wait_for_selector('[data-panel="0:1"] canvas[data-series="io/output 0"][data-columns]')
        # trimming's outliers reach past the bins on every step: a band, and no caret shouting it
        assert int(strip.get_attribute("data-beyond")) == 6
        assert int(strip.get_attribute("data-carets")) == 0
        assert errors == []
    finally:
        context.close()


def _ended_early(tmp_path):
    """AdamW at a warm-up lr for 3 steps, then a sane one: every weight's update ratio was above
    1e-2 at first and is fine now: findings that ended long ago."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    with _watch(model, tmp_path, log=("io", "io_grad", "params", "params_grad", "updates")):
        for step in range(30):
            if step == 3:
                for group in opt.param_groups:
                    group["lr"] = 1e-3
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return str(tmp_path / "run")


def test_findings_that_ended_long_ago_are_history_not_alarms(tmp_path):
    from torchlens.train.health import findings, status_line

    rows = findings(tl.open_run(_ended_early(tmp_path)))
    assert {(r["call"], r["signal"], r["first_step"], r["active"]) for r in rows} == {
        (c, "update_ratio", 0, False) for c in ("0:1", "2:1", "4:1")
    }
    assert status_line(rows) == "healthy now: 3 findings ended earlier (update_ratio)"


def test_the_page_folds_ended_findings_without_badges_and_keeps_pinned_strips_in_view(browser, tmp_path):
    from torchlens.train.serve import export_html

    path = export_html(_ended_early(tmp_path), str(tmp_path / "run.html"))
    context, page, errors = _open_file(browser, path)
    try:
        panel = page.wait_for_selector('[data-role="health"]:not([hidden])')
        assert "no finding now" in panel.inner_text() and "clear" in panel.get_attribute("class")
        assert "healthy now" in page.inner_text('[data-role="health-status"]')
        fold = page.query_selector('[data-role="health-ended"]')
        assert fold is not None and fold.get_attribute("open") is None  # folded
        assert "3 ended earlier" in fold.inner_text()
        assert page.query_selector_all(".health-badge") == []  # no node badged by history
        page.drag_and_drop('[data-node="2:1"]', '[data-role="panels"]')
        strip = page.wait_for_selector('[data-panel="2:1"] canvas[data-series]')
        assert strip.bounding_box()["y"] < 900  # the pinned strips start above the fold
        assert errors == []
    finally:
        context.close()


def test_the_rerun_copy_carries_no_probe_of_a_saturating_activation(tmp_path):
    """A Tanh gets a saturation hook on logged steps; the sentinel's copy of the model must not."""
    model = Drift(nn.Sequential(nn.Tanh(), LogAct()))
    with _watch(model, tmp_path, on_nonfinite="trace", log_freq=1):
        with pytest.warns(NonfiniteWarning):
            _train(model, BAD_STEP + 1)
    (event,) = _events(tmp_path)
    assert event["call"] == "act.1:1" and event["report"]["label"].startswith("log_")


# ----- the page ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sick(tmp_path_factory):
    from examples.health_images import train_run
    from torchlens.train.serve import explore

    run_dir = str(tmp_path_factory.mktemp("sick") / "run")
    train_run(run_dir)
    server = explore(run_dir, port=0, block=False)
    yield types.SimpleNamespace(url=server.url, run_dir=run_dir)
    server.close()


def test_the_page_shows_the_health_panel_badges_and_opens_a_finding(browser, sick):
    sick_url = sick.url
    from examples.health_images import NAN_STEP

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    problems = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status} {r.url}"))
    try:
        page.goto(sick_url)
        page.wait_for_selector('[data-role="health"] li')
        status = page.inner_text('[data-role="health-status"]')
        assert f"since step {NAN_STEP} in encoder.2.act" in status and "log_" in status
        items = page.eval_on_selector_all(
            '[data-role="health"] li', "els => els.map(e => [e.dataset.call, e.querySelector('.chip').textContent])"
        )
        assert items[0] == ["encoder.2.act:1", "NaN/Inf"]  # worst first
        assert ["encoder.0.act:1", "saturated"] in items and ["encoder.1.act:1", "dead"] in items
        # badges: the encoder holds every finding, the head none
        badge = page.eval_on_selector(
            '[data-node="encoder:1"] .health-badge', "b => [b.dataset.signal, b.querySelector('text').textContent]"
        )
        assert badge == ["nonfinite", str(len(items))]
        assert page.query_selector('[data-node="head:1"] .health-badge') is None
        # a click opens the call's parent, pins its strips and marks the step
        page.click('[data-role="health"] li[data-call="encoder.2.act:1"]')
        page.wait_for_selector('[data-crumb="encoder.2:1"].here')
        page.wait_for_selector('[data-panel="encoder.2.act:1"] .health-mark')
        marks = page.eval_on_selector_all(
            '[data-panel="encoder.2.act:1"] .health-mark', "els => els.map(e => Number(e.dataset.step))"
        )
        assert marks and set(marks) == {NAN_STEP}
        assert page.query_selector('[data-node="encoder.2.act:1"] .health-badge') is not None
        # the operation-level page the sentinel saved is served, opened on the producer
        href = page.get_attribute('[data-role="health"] li[data-call="encoder.2.act:1"] a.op-page', "href")
        answer = page.request.get(sick_url.rstrip("/") + href)
        assert answer.status == 200 and "non-finite values" in answer.text()
        assert page.request.get(sick_url.rstrip("/") + "/run-file?name=run.db").status == 404  # nothing else
        assert problems == []
    finally:
        context.close()


@pytest.mark.parametrize("lr, size", [(1e-7, "small"), (5.0, "large")])
def test_a_learning_rate_too_small_or_too_large_is_found(tmp_path, lr, size):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 1))  # no ReLU: a large step kills none
    kinds = ("io", "io_grad", "params", "params_grad", "updates")
    h = _fit(model, tmp_path, steps=3, lr=lr, log=kinds)
    ratio = _rows(h, "update_ratio")
    assert set(ratio.call) == {"0:1", "1:1"} and set(ratio.series) == {"updates/weight"}  # biases start at 0
    assert all(f"too {size}" in e for e in ratio.explanation), ratio.explanation.tolist()


def test_an_exported_page_carries_the_health_panel(browser, tmp_path, sick):
    from torchlens.train.serve import export_html

    path = export_html(sick.run_dir, str(tmp_path / "run.html"))
    context, page, errors = _open_file(browser, path)
    try:
        page.wait_for_selector('[data-role="health"] li')
        assert "since step" in page.inner_text('[data-role="health-status"]')
        assert page.query_selector('[data-node="encoder:1"] .health-badge') is not None
        assert page.query_selector('[data-role="health"] a.op-page') is None  # that file is not in the export
        assert errors == []
    finally:
        context.close()


def test_manual_steps_are_checked_and_evaluation_is_not(tmp_path):
    model = Drift(LogAct())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.rand(16, 4)

    def train_step(n):
        w.begin_step(n)
        opt.zero_grad()
        model(x).mean().backward()

    with _watch(model, tmp_path, on_nonfinite="warn", manual_steps=True, log_freq=2) as w:
        train_step(30)  # finite
        _break(model)
        model.eval()
        model(x).mean().backward()  # NaN in evaluation mode (gradients on): not a training step
        model.train()
        with pytest.warns(NonfiniteWarning, match="step 31 .*'act:1'"):
            train_step(31)
    assert [e["step"] for e in _events(tmp_path)] == [31]


def test_health_of_a_run_with_a_gradient_series_without_values(tmp_path):
    class Quantize(nn.Module):
        def forward(self, x):
            return x.round().long()  # stops the gradient: its io_grad series has no columns

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 4)
            self.quant = Quantize()

        def forward(self, x):
            h = self.lin(x)
            return h + self.quant(h).float()

    model = Net()
    with _watch(model, tmp_path) as w:
        for _ in range(3):
            model(torch.randn(4, 3)).pow(2).mean().backward()
    h = tl.open_run(w.run_dir).health()
    assert "quant:1" not in set(h.call)
