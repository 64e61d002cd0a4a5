"""``print(history)``: a small pass prints the seed's listing (module hierarchy, numbered layers);
a larger one a header and one row per module, identical blocks folded; ``summary()`` gives every
module's row and ``print_layers()`` every layer."""

from __future__ import annotations

import pytest
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
    def __init__(self, n: int, alike: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        if not alike:  # no two neighbours alike: nothing folds
            for block in self.blocks[1::2]:
                block.fc.bias = None
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


def _layer_lines(text: str) -> list:
    return [line.strip() for line in text.splitlines() if line.startswith("\t\t") and ": " in line]


def test_print_of_a_small_pass_is_the_seeds_listing():
    """The seed's AlexNet printout: hierarchy, then ``0: input_1_0`` ... ``23: output_1_23``."""
    torchvision = pytest.importorskip("torchvision")
    h = tl.log_forward_pass(torchvision.models.alexnet(), torch.rand(1, 3, 224, 224), random_seed=0)
    lines = str(h).splitlines()
    assert lines[0] == "Log of AlexNet forward pass:"
    assert lines[1] == "\tModel structure: purely feedforward, without branching; 23 total modules."
    hierarchy = lines.index("\tModule Hierarchy:")
    assert lines[hierarchy + 1 : hierarchy + 3] == [
        "\t\tfeatures:",
        "\t\t    features.0, features.1, features.2, features.3, features.4, features.5, features.6, features.7,",
    ]
    assert "\t\tavgpool" in lines and "\t\tclassifier:" in lines
    assert lines[lines.index("\tLayers:") + 1] == "\t\t0: input_1_0"
    assert _layer_lines(str(h)) == [f"{i}: {label}" for i, label in enumerate(h.layer_labels)]
    assert _layer_lines(str(h))[7] == "7: conv2d_3_7" and lines[-1] == "\t\t23: output_1_23"
    assert "Module  " not in str(h)  # the module table is summary()'s
    assert "features.6" in _rows(h.summary())


def test_print_is_a_module_table_above_60_layers_with_identical_blocks_folded():
    h = tl.log_forward_pass(Stack(25), torch.rand(3, 8), random_seed=0)  # 81 layers
    assert len(h) > 60
    text = str(h)
    assert all(label not in text for label in h.layer_labels[1:-1])  # no per-layer lines
    rows = _rows(text)
    # blocks.0 runs twice, so it differs from the 24 others, which fold into one row
    assert list(rows) == [
        "blocks",
        "blocks.0",
        "blocks.0.fc",
        "blocks.0.act",
        "blocks.1-24",
        "blocks.1-24.fc",
        "blocks.1-24.act",
        "head",
    ]
    assert rows["blocks.1-24"].split()[:4] == ["blocks.1-24", "Block", "x24", "1"]
    assert rows["blocks.1-24.fc"].startswith("    blocks.1-24.fc ") and "72" in rows["blocks.1-24.fc"].split()
    cells = rows["blocks.0"].split()
    assert cells[:3] == ["blocks.0", "Block", "2"]  # called twice
    assert " ".join(cells[3:5]) == "(3, 8)"
    assert rows["blocks"].split()[-3] == f"{25 * 72:,}"  # a container counts its submodules' params
    saved = sum(e.saved_nbytes for e in h if e.containing_module == "head")
    assert rows["head"].endswith(tl.trace.records.format.human_bytes(saved))
    assert text.endswith(
        "identical blocks folded (blocks.1-24 stands for 24 Block; the numbers are each one's): "
        "history.summary() shows all."
    )
    every = _rows(h.summary())  # every module, one row each
    assert list(every) == ["blocks"] + [a for a in h.module_addresses if a.startswith("blocks.")] + ["head"]
    assert h.summary().endswith(
        "history.print_layers() lists every one; history.summary(depth=1) shows the top-level modules only."
    )


def test_blocks_differing_in_anything_do_not_fold():
    h = tl.log_forward_pass(Stack(25, alike=False), torch.rand(3, 8), random_seed=0)
    rows = _rows(str(h))
    assert "blocks.1" in rows and "blocks.2" in rows and not any("-" in address for address in rows)
    assert "folded" not in str(h)


@pytest.mark.parametrize("n_layer", [6, 12])
def test_print_of_a_gpt2_fits_in_80_lines(n_layer):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=n_layer, n_embd=64, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    h = tl.log_forward_pass(model, torch.randint(0, 100, (1, 8)), random_seed=0)
    text = str(h)
    assert len(text.splitlines()) <= 80
    rows = _rows(text)
    last = n_layer - 1
    assert rows[f"transformer.h.0-{last}"].split()[1:3] == ["GPT2Block", f"x{n_layer}"]
    assert f"transformer.h.0-{last}.attn.c_attn" in rows and "transformer.h.1" not in text
    assert len(_rows(h.summary())) == len(h.module_addresses)  # summary() still lists every block


def test_summary_depth_and_the_full_listing(capsys):
    h = tl.log_forward_pass(Stack(2), torch.rand(3, 8), random_seed=0)
    assert list(_rows(h.summary(depth=1))) == ["blocks", "head"]
    assert list(_rows(h.summary(depth=2))) == ["blocks", "blocks.0", "blocks.1", "head"]
    assert "Module " not in h.summary(depth=0)
    assert repr(h.summary()) == str(h.summary())  # shows as text in a notebook
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
    h = tl.log_forward_pass(Stack(150, alike=False), torch.rand(1, 8), random_seed=0)  # 451 modules
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

    text = tl.log_forward_pass(Outer(), torch.rand(1, 4), random_seed=0).summary()
    assert "(1, 2) +6 more" in _rows(text)["body"]


def test_a_meta_pass_is_not_said_to_have_saved_bytes():
    h = tl.log_forward_pass(Stack(25), torch.rand(3, 8), device="meta")  # 81 layers: the module table
    text = str(h)
    assert "computed in forward pass; no values saved (meta tensors: shapes and dtypes only)." in text
    assert all(row.split()[-1] == "-" for row in _rows(text).values())  # the Saved column
    real = str(tl.log_forward_pass(Stack(25), torch.rand(3, 8), random_seed=0))
    assert "tensors (" in real.splitlines()[2].split(";")[1] and "no values saved" not in real
