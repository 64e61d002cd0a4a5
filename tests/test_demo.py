"""The main demo runs and writes its drawings."""

import pytest

from examples import demo


@pytest.mark.slow
def test_demo_writes_drawings(tmp_path, capsys):
    demo.main(str(tmp_path))
    out = capsys.readouterr().out
    assert "validate_model_activations(resnet18): True" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "alexnet.svg",
        "explorer.html",
        "recurrent_rolled.svg",
        "recurrent_unrolled.svg",
        "resnet18.svg",
        "resnet18_depth1.svg",
        "resnet18_run",
    ]
    assert "logged steps [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]" in out
    assert "window.TORCHLENS_EXPORT" in (tmp_path / "explorer.html").read_text()
    assert (tmp_path / "recurrent_rolled.svg").read_text().lstrip().startswith("<?xml")
