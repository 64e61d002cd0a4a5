"""tl.find_nonfinite and ModelHistory.first_nonfinite: the operation that first made NaN/Inf,
forward and backward, its source line, and a model left as it was found."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.trace.answers import NonfiniteReportError


def line_of(method, text: str) -> int:
    """The line number of the first line of ``method`` containing ``text``."""
    lines, start = inspect.getsourcelines(method)
    return start + next(i for i, line in enumerate(lines) if text in line)


def check(report, phase: str, label_start: str, kind: str, method=None, text: str = None) -> None:
    assert report.found, str(report)
    assert report.phase == phase, str(report)
    assert report.label.startswith(label_start), str(report)
    assert report.kind == kind, str(report)
    if method is not None:
        assert report.source is not None and report.source.line_number == line_of(method, text), str(report)


class Log(nn.Module):
    def forward(self, x):
        y = x * 2
        z = torch.log(y)
        return z + 1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        shifted = self.fc(x) - 100.0
        return torch.sqrt(shifted)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Identity(), Block())

    def forward(self, x):
        return self.blocks(x).sum(-1)


class ZeroOverZero(nn.Module):
    def forward(self, x):
        centred = x - x.mean()
        return centred / centred.abs()


class InfMinusInf(nn.Module):
    def forward(self, x):
        big = torch.exp(x * 1000)
        return big - big


class MaskedSoftmax(nn.Module):
    def forward(self, scores, mask):
        masked = scores.masked_fill(mask, float("-inf"))
        return torch.softmax(masked, dim=-1)


class HalfOverflow(nn.Module):
    def forward(self, x):
        h = x.half()
        return h * 60000


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return torch.relu(self.lin(x))


class SqrtAtZero(nn.Module):
    """Finite forward; d sqrt(u)/du at u = 0 is inf in backward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        u = self.lin(x).abs() * 0  # +0, so the gradient is +inf
        return torch.sqrt(u)


class ZeroRowNorm(nn.Module):
    """A hand-written row norm; a zero row gives 0 * inf = nan in backward. (torch.norm's own
    backward masks a zero norm, so it stays finite.)"""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        h = self.lin(x) * torch.tensor([[0.0], [1.0]])
        return (h * h).sum(-1).sqrt()


def test_log_of_a_negative():
    report = tl.find_nonfinite(Log(), torch.tensor([1.0, -1.0]))
    check(report, "forward", "log", "nan", Log.forward, "torch.log(y)")
    assert [p.label for p in report.parents] == ["mul_1_1"]
    assert report.parents[0].has_negatives and report.parents[0].min == -2.0
    assert report.propagated[0].startswith("add")
    assert "log_1_2" in str(report) and f":{report.source.line_number}" in str(report)


def test_sqrt_of_a_negative_names_the_module():
    report = tl.find_nonfinite(Nested(), torch.zeros(2, 3))
    check(report, "forward", "sqrt", "nan", Block.forward, "torch.sqrt")
    assert report.module == "blocks.1"
    assert report.parents[0].label.startswith("sub") and report.parents[0].max < 0
    assert "inside module 'blocks.1'" in str(report)


def test_zero_over_zero():
    report = tl.find_nonfinite(ZeroOverZero(), torch.tensor([1.0, 2.0, 3.0]))
    check(report, "forward", "truediv", "nan", ZeroOverZero.forward, "centred / centred.abs()")
    assert all(p.has_zeros for p in report.parents)


def test_inf_minus_inf_reports_the_inf_and_the_first_nan():
    report = tl.find_nonfinite(InfMinusInf(), torch.tensor([0.0, 1.0]))
    check(report, "forward", "exp", "inf", InfMinusInf.forward, "torch.exp")
    nan = report.first_nan
    assert nan is not None and nan.label.startswith("sub") and nan.kind == "nan"
    assert nan.source.line_number == line_of(InfMinusInf.forward, "big - big")
    assert nan.label in report.propagated


def test_masked_softmax_with_a_row_all_minus_inf():
    scores = torch.randn(2, 3)
    mask = torch.tensor([[True, True, True], [False, True, False]])
    report = tl.find_nonfinite(MaskedSoftmax(), (scores, mask))
    check(report, "forward", "maskedfill", "-inf", MaskedSoftmax.forward, "masked_fill")
    nan = report.first_nan
    assert nan.label.startswith("softmax") and nan.source.line_number == line_of(MaskedSoftmax.forward, "softmax")
    assert "The first NaN came later, in softmax" in str(report)


def test_fp16_overflow():
    report = tl.find_nonfinite(HalfOverflow(), torch.tensor([1.0, 2.0]))
    check(report, "forward", "mul", "inf", HalfOverflow.forward, "h * 60000")
    assert report.parents[0].label.startswith("half") and report.parents[0].max == 2.0
    assert report.first_nan is None


def test_nan_weight_is_a_parameter_answer():
    model = Linear()
    with torch.no_grad():
        model.lin.weight[0, 0] = float("nan")
    report = tl.find_nonfinite(model, torch.ones(1, 2))
    assert (report.phase, report.label, report.kind, report.module) == ("parameter", "lin.weight", "nan", "lin")
    assert any(x.startswith("linear") for x in report.propagated)
    assert "lin.weight" in str(report)


def test_inf_buffer_is_a_parameter_answer():
    model = nn.BatchNorm1d(2).eval()
    model.running_var[1] = float("inf")
    report = tl.find_nonfinite(model, torch.ones(3, 2))
    assert (report.phase, report.label, report.kind) == ("parameter", "running_var", "inf")


def test_nan_input():
    report = tl.find_nonfinite(Linear(), torch.tensor([[1.0, float("nan")]]))
    assert (report.phase, report.label, report.kind, report.address) == ("input", "input_1_0", "nan", "input.x")
    assert report.propagated[0].startswith("linear")


def test_backward_only_sqrt_at_zero():
    report = tl.find_nonfinite(SqrtAtZero(), torch.ones(2, 2))
    check(report, "backward", "sqrt", "inf", SqrtAtZero.forward, "torch.sqrt(u)")
    assert report.parents[0].label.startswith("mul") and report.parents[0].has_zeros
    assert report.parents[0].gradient_kind == "inf"
    assert report.gradient_finite[report.label] is True
    assert report.gradient_finite[report.parents[0].label] is False
    assert "lin.weight" in report.propagated
    # without backward the same model is finite
    assert not tl.find_nonfinite(SqrtAtZero(), torch.ones(2, 2), backward=False).found


def test_backward_only_norm_of_a_zero_row():
    report = tl.find_nonfinite(ZeroRowNorm(), torch.ones(2, 2))
    check(report, "backward", "sqrt", "inf", ZeroRowNorm.forward, ".sqrt()")
    assert report.parents[0].label.startswith("sum") and report.parents[0].has_zeros


def test_a_loss_that_overflows():
    report = tl.find_nonfinite(Linear(), torch.ones(1, 2), loss_fn=lambda out: torch.exp(out + 1e4).sum())
    assert report.found and report.phase == "loss" and report.kind == "inf"
    assert report.label is None and "loss" in str(report)


class Finite(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return torch.softmax(torch.tanh(self.block.fc(x)), dim=-1)


def test_finite_model():
    report = tl.find_nonfinite(Finite(), torch.full((2, 3), 1000.0))
    assert report.found is False and report.label is None and report.checked_backward
    assert report.finite and all(flag is not False for flag in report.finite.values())
    assert report.gradient_finite and all(flag is not False for flag in report.gradient_finite.values())
    assert str(report).startswith("No NaN or Inf")
    assert report.history.num_tensors_saved == 0  # nothing saved when nothing was found


def test_report_keeps_only_the_neighbourhood():
    report = tl.find_nonfinite(Log(), torch.tensor([1.0, -1.0]))
    saved = {e.label for e in report.history if e.has_saved_activation}
    assert saved == {"log_1_2", "mul_1_1"}
    assert report.finite["log_1_2"] is False and report.finite["mul_1_1"] is True


def test_parameter_grads_are_unchanged():
    model = SqrtAtZero()
    before = torch.full_like(model.lin.weight, 3.0)
    model.lin.weight.grad = before
    report = tl.find_nonfinite(model, torch.ones(2, 2))
    assert report.phase == "backward"
    assert model.lin.weight.grad is before and torch.equal(before, torch.full_like(before, 3.0))
    assert model.lin.bias.grad is None


class Stateful(nn.Module):
    """Batch-norm statistics, dropout and a write into its own parameter during forward."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(2)
        self.lin = nn.Linear(2, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        with torch.no_grad():
            self.lin.bias.add_(1.0)
        return torch.log(self.drop(self.lin(self.bn(x))) - 100.0)


def test_torch_and_model_restored():
    model = Stateful()
    model.lin.weight.requires_grad_(False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    functions = (torch.log, torch.Tensor.add_, nn.functional.linear)
    x = torch.randn(4, 2)
    rng = torch.get_rng_state()
    report = tl.find_nonfinite(model, x)
    assert report.found
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert model.training and not model.lin.weight.requires_grad and model.lin.bias.requires_grad
    assert (torch.log, torch.Tensor.add_, nn.functional.linear) == functions
    assert torch.equal(torch.get_rng_state(), rng)


def test_inputs_are_not_changed():
    class WritesInput(nn.Module):
        def forward(self, x):
            x.mul_(0)
            return torch.log(x)

    x = torch.ones(3)
    report = tl.find_nonfinite(WritesInput(), x)
    assert report.label.startswith("log") and report.kind == "-inf"
    assert torch.equal(x, torch.ones(3))


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x):
        return self.lin(x) @ torch.ones(2, 2)  # 3 columns against 2 rows


def test_a_model_that_raises():
    model = Raises()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    matmul = torch.Tensor.__matmul__
    with pytest.raises(RuntimeError) as info:
        tl.find_nonfinite(model, torch.ones(1, 2))
    assert "torchlens: Raises raised RuntimeError" in "\n".join(getattr(info.value, "__notes__", [str(info.value)]))
    assert torch.Tensor.__matmul__ is matmul
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert tl.find_nonfinite(Linear(), torch.ones(1, 2)).found is False  # torchlens still works


def test_history_first_nonfinite_matches():
    x = torch.tensor([1.0, -1.0])
    history = tl.log_forward_pass(Log(), x)
    from_history = history.first_nonfinite()
    assert (from_history.label, from_history.kind) == ("log_1_2", "nan")
    assert from_history.source.line_number == line_of(Log.forward, "torch.log(y)")
    assert from_history.propagated == ["add_1_3", "output_1_4"]
    assert not tl.log_forward_pass(Log(), torch.ones(2)).first_nonfinite().found


def test_history_first_nonfinite_needs_activations():
    history = tl.get_model_metadata(Log(), torch.ones(2))
    with pytest.raises(NonfiniteReportError, match="layers_to_save='all'"):
        history.first_nonfinite()
    assert issubclass(NonfiniteReportError, tl.TorchlensError) and issubclass(NonfiniteReportError, ValueError)


def test_bad_loss_fn():
    with pytest.raises(TypeError, match="loss_fn"):
        tl.find_nonfinite(Linear(), torch.ones(1, 2), loss_fn="sum")
    with pytest.raises(TypeError, match="one element"):
        tl.find_nonfinite(Linear(), torch.ones(1, 2), loss_fn=lambda out: out)
    with pytest.raises(AttributeError) as info:
        tl.find_nonfinite(Linear(), torch.ones(1, 2), loss_fn=lambda out: out.logits.sum())
    assert "loss_fn raised this" in "\n".join(getattr(info.value, "__notes__", [str(info.value)]))


def test_to_pandas_roles():
    pytest.importorskip("pandas")
    table = tl.find_nonfinite(Log(), torch.tensor([1.0, -1.0])).to_pandas()
    roles = dict(zip(table.label, table.role))
    assert roles["log_1_2"] == "producer" and roles["mul_1_1"] == "parent" and roles["add_1_3"] == "propagated"


class Wide(nn.Module):
    def forward(self, x, z):
        big = x.double() * 1e300  # finite in float64, inf if read as float32
        return big.sum(), torch.view_as_real(z * 2), (x.bfloat16() * 1e38).float()


def test_dtypes_are_read_exactly():
    z = torch.tensor([1 + 1j, 2 - 1j])
    report = tl.find_nonfinite(Wide(), (torch.ones(2), z), backward=False)
    assert not report.found, str(report)
    z_nan = torch.tensor([1 + 1j, complex(float("nan"), 0.0)])
    report = tl.find_nonfinite(Wide(), (torch.tensor([1.0, 9.0]), z_nan), backward=False)
    assert (report.phase, report.label, report.kind) == ("input", "input_2_1", "nan")


def test_import_torchlens_does_not_load_answers():
    import subprocess
    import sys

    code = "import sys, torchlens; print('torchlens.trace.answers' in sys.modules); torchlens.find_nonfinite; print('torchlens.trace.answers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


class WritesItsParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight[:, 0] = self.lin.weight[:, 0] * 2  # part of the parameter, written in place
            self.lin.bias.data.add_(1.0)  # through .data: the same memory
        return torch.log(self.lin(x) - 100.0)


def test_parameter_writes_are_undone():
    model = WritesItsParameters()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = tl.find_nonfinite(model, torch.randn(3, 2))
    assert report.found
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not report.notes


def test_a_write_torchlens_cannot_see_is_named():
    from torchlens.trace.answers.nonfinite.snapshot import ModelSnapshot

    model = WritesItsParameters()
    snapshot = ModelSnapshot(model)
    with torch.no_grad():
        model.lin.bias.add_(1.0)  # outside any pass: no copy was taken
    assert snapshot.restore() == ["lin.bias"]


class SqrtOfAParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return x * torch.sqrt(self.scale)


def test_backward_into_a_parameter():
    report = tl.find_nonfinite(SqrtOfAParameter(), torch.ones(2))
    check(report, "backward", "sqrt", "inf", SqrtOfAParameter.forward, "torch.sqrt(self.scale)")
    assert [(p.label, p.gradient_kind, p.has_zeros) for p in report.parents] == [("scale", "inf", True)]


def test_a_meta_model_is_refused_not_called_finite():
    """A pass without values cannot be called finite (as compare, validate and rerun refuse)."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with pytest.raises(tl.MetaDeviceError, match="find_nonfinite needs tensor values.*meta device"):
        tl.find_nonfinite(model, torch.zeros(2, 4, device="meta"))
    real = nn.Linear(4, 1)  # real weights, a meta input: still no values
    with pytest.raises(tl.MetaDeviceError, match="find_nonfinite"):
        tl.find_nonfinite(real, torch.zeros(2, 4, device="meta"))


def test_a_backward_that_torch_cannot_run_says_how_to_check_the_forward_alone():
    class NoBackward(Linear):
        def forward(self, x):
            return NoGrad.apply(self.lin(x))

    class NoGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("no backward for this op")

    with pytest.raises(NotImplementedError, match="no backward") as caught:
        tl.find_nonfinite(NoBackward(), torch.randn(2, 2))
    assert any("backward=False" in note for note in getattr(caught.value, "__notes__", []))
    assert not tl.find_nonfinite(NoBackward(), torch.randn(2, 2), backward=False).found
