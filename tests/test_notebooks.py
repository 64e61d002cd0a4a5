"""The notebooks in local_jupyter_tests/ run top to bottom without errors, as a user runs them."""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "local_jupyter_tests").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    book = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if "drawing" in path.stem:  # the history and show_model_graph display inline as SVG
        assert sum("image/svg+xml" in o.get("data", {}) for o in outputs) >= 2


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3
