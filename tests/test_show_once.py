"""``history.show(...)`` as the last line of a notebook cell shows the page once, with no warning
(issue 42: it was shown twice, under IPython's "consider IFrame" warning)."""

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.slow  # a Jupyter kernel starts
def test_show_as_a_cells_last_line_displays_the_page_once(tmp_path):
    code = (
        "import torch, torchlens as tl\n"
        "h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)\n"
        "h.show(height=400)"
    )
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = book.cells[0].outputs
    assert [o.output_type for o in outputs] == ["display_data"], outputs  # no second copy, no stderr
    assert (
        outputs[0].data["text/html"].startswith("<iframe srcdoc=") and "height: 400px" in outputs[0].data["text/html"]
    )
