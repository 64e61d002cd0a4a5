"""The live explorer page counts steps as the server does (issue 41 item 13): an answer to a poll
that overlaps a newer summary (a call appeared, so the page took the whole summary again) must
not be added on top of it. Headless Chromium through the ``browser`` fixture of conftest.py."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl
from torchlens.train.serve.data import Catalog

STATUS = '[data-role="status"]'


class Growing(nn.Module):
    """Calls ``b`` only once ``use_b`` is set: the run gains a call mid-training."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.use_b = False

    def forward(self, x):
        x = self.a(x)
        return self.b(x) if self.use_b else x


def _status_reads(page, text, timeout=10_000):
    try:
        page.wait_for_function(
            "([sel, text]) => document.querySelector(sel).textContent.includes(text)",
            arg=[STATUS, text],
            timeout=timeout,
        )
    except Exception:  # say what the page read instead
        raise AssertionError(f"the status line reads {page.inner_text(STATUS)!r}, not {text!r}") from None


def _train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_a_poll_answer_carries_the_servers_count(tmp_path):
    model = Growing()
    with tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False) as w:
        _train(model, 3)
        w.flush()
        catalog = Catalog(w.run_dir)
        news = catalog.poll_json(None, 1)
        assert news["steps"] == [2] and news["num_steps"] == 3 and news["last_step"] == 2
        catalog.close()


def test_a_poll_answer_older_than_the_summary_is_not_counted_twice(browser, tmp_path):
    torch.manual_seed(0)
    model = Growing()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        loss = model(torch.randn(2, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    w = tl.watch(model, run_dir=str(tmp_path / "run"), port=0, verbose=False)
    context = browser.new_context()
    try:
        step()
        step()
        w.flush()
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(w.url)
        _status_reads(page, "2 logged steps (last 1)")
        held = []

        def late_answer(route):
            """The first poll that brings a step is answered only after three more steps are
            written: the page, seeing a new call, then reads a summary newer than the answer."""
            response = route.fetch()
            if not held and response.json()["steps"]:
                held.append(response.json())
                for _ in range(3):
                    step()
                w.flush()
            route.fulfill(response=response)

        page.route("**/api/poll*", late_answer)
        model.use_b = True  # step 2 brings the call of b
        step()
        w.flush()
        _status_reads(page, "6 logged steps (last 5)")
        page.wait_for_timeout(2500)  # a poll period more: the count stays the server's
        assert "6 logged steps (last 5) · running" in page.inner_text(STATUS)
        assert held and held[0]["steps"] == [2] and held[0]["num_calls"] == 3 and held[0]["num_steps"] == 3
        assert errors == []
    finally:
        context.close()
        w.close()
