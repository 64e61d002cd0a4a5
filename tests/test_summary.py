"""``print(history)``: a header and one row per module; ``print_layers()`` lists every layer."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x)) + x


class Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        x = self.blocks[0](x)  # a second call of the first block
        return self.head(x)


def _rows(text: str) -> dict:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Module "))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows[line.split()[0]] = line
    return rows


def test_print_is_a_module_table_not_every_layer():
    h = tl.log_forward_pass(Stack(12), torch.rand(3, 8), random_seed=0)
    text = str(h)
    assert len(text.splitlines()) <= 12 + len(h.module_addresses)  # header, one row per module, footer
    assert all(label not in text for label in h.layer_labels[1:-1])  # no per-layer lines
    rows = _rows(text)
    assert list(rows) == ["blocks"] + [a for a in h.module_addresses if a.startswith("blocks.")] + ["head"]
    cells = rows["blocks.0"].split()
    assert cells[:3] == ["blocks.0", "Block", "2"]  # called twice
    assert " ".join(cells[3:5]) == "(3, 8)"
    fc = rows["blocks.0.fc"]
    assert fc.startswith("    blocks.0.fc ")  # indented by depth
    assert "72" in fc.split()  # 8*8 + 8 params
    assert rows["blocks"].split()[-3] == f"{12 * 72:,}"  # a container counts its submodules' params
    saved = sum(e.saved_nbytes for e in h if e.containing_module == "head")
    assert rows["head"].endswith(tl.trace.records.format.human_bytes(saved))
    assert text.endswith(
        "history.print_layers() lists every one; history.summary(depth=1) shows the top-level modules only."
    )


def test_summary_depth_and_the_full_listing(capsys):
    h = tl.log_forward_pass(Stack(2), torch.rand(3, 8), random_seed=0)
    assert list(_rows(h.summary(depth=1))) == ["blocks", "head"]
    assert list(_rows(h.summary(depth=2))) == ["blocks", "blocks.0", "blocks.1", "head"]
    assert "Module " not in h.summary(depth=0)
    assert h.summary() == str(h) and repr(h.summary()) == str(h)  # shows as text in a notebook
    h.print_layers()
    listing = capsys.readouterr().out
    assert [
        line.split(": ")[1] for line in listing.splitlines() if line.startswith("\t\t") and ": " in line
    ] == h.layer_labels
    for bad in (-1, 1.5, True):
        try:
            h.summary(depth=bad)
        except ValueError as error:
            assert "depth must be None or an int" in str(error)
        else:
            raise AssertionError(f"depth={bad!r} was accepted")


def test_default_print_of_a_huge_model_stays_short():
    h = tl.log_forward_pass(Stack(150), torch.rand(1, 8), random_seed=0)  # 451 modules
    text = str(h)
    assert len(text.splitlines()) < 270
    assert list(_rows(text))[:3] == ["blocks", "blocks.0", "blocks.1"] and "blocks.0.fc" not in text
    assert text.endswith("300 deeper modules not shown: history.summary() shows all.")
    assert "blocks.149.fc" in h.summary()


def test_the_main_output_comes_first_in_the_output_shape():
    class Cached(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            cache = [[x * i, x + i] for i in range(3)]
            return {"cache": cache, "hidden": self.inner(x)[:, :2]}

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = Cached()

        def forward(self, x):
            return self.body(x)

    text = str(tl.log_forward_pass(Outer(), torch.rand(1, 4), random_seed=0))
    assert "(1, 2) +6 more" in _rows(text)["body"]
