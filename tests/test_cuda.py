"""The tracer and its answers on a CUDA device: the same histories as on the CPU, no host
synchronisation during a trace, and clear refusals where a trace cannot work. Every test here
is marked ``cuda`` and skips without a CUDA device (CI has none); run them on a GPU with
``pytest -m cuda``."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

import torchlens as tl
from torchlens.trace.capture.run import CudaGraphCaptureError

pytestmark = pytest.mark.cuda


def _resnet(device: str = "cuda") -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval().to(device)


def _image(device: str = "cuda", batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(1)).to(device)


def test_a_cuda_trace_has_the_cpu_trace_s_layers_and_the_plain_forward_s_values():
    on_cpu = tl.log_forward_pass(_resnet("cpu"), _image("cpu"), random_seed=0)
    model = _resnet()
    on_gpu = tl.log_forward_pass(model, _image(), random_seed=0)
    assert on_gpu.layer_labels == on_cpu.layer_labels
    last = on_gpu.layer_labels[-1]
    assert on_gpu[last].activation.device.type == "cuda"
    with torch.no_grad():  # the same kernels (TF32 convolutions and all) as the traced pass
        torch.testing.assert_close(on_gpu[last].activation, model(_image()))


def test_a_trace_makes_no_host_synchronisation():
    """Reading a value on the host would stall the GPU's queue once per op: never during a
    trace (the mode turns any synchronising call into an error)."""
    from tiny_llms import gpt2

    models = [(_resnet(), (_image(),)), (gpt2().cuda(), (torch.randint(0, 50, (2, 8), device="cuda"),))]
    for model, args in models:
        model(*args)  # warm: the first call's lazy initialisation may synchronise
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            history = tl.log_forward_pass(model, args)
            metadata = tl.log_forward_pass(model, args, layers_to_save=None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert len(history) == len(metadata) > 10


def test_the_buffers_of_an_eval_model_cost_one_copy_launch_together():
    """ResNet-18's 40 BatchNorm statistics are copied at the end of the pass in one multi-tensor
    copy (with the input the caller holds), not one clone each: the trace's device work is the
    plain forward's plus the copies before in-place writes (relu_, +=) and that one."""
    from torch.profiler import ProfilerActivity, profile

    model, x = _resnet(), _image()
    model(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        history = tl.log_forward_pass(model, x)
    names = [e.name for e in prof.events()]
    assert names.count("aten::_foreach_copy_") == 1
    assert names.count("aten::clone") == 25  # 17 in-place relu_ and 8 += write into saved values
    before = history["bn1.running_mean"].activation.clone()
    model.train()(_image(batch=4) * 3)  # training moves the statistics in place
    assert torch.equal(history["bn1.running_mean"].activation, before)
    assert not torch.equal(model.bn1.running_mean, before)


def test_validation_on_cuda():
    assert tl.validate_model_activations(_resnet(), _image(), random_seed=0)


def test_validating_a_history_waits_for_the_gpu_once():
    import warnings

    from torchlens.trace.validate import validate_history

    history = tl.log_forward_pass(_resnet(), _image(), save_function_args=True, random_seed=0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert validate_history(history)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    assert len(syncs) <= 2, [str(w.message) for w in syncs[:5]]  # the verdicts' one read (and its stack)


def test_validating_a_model_waits_for_the_gpu_a_few_times_not_once_per_parameter():
    """The plain run's outputs compared, the replays' verdicts read together, the parameters'
    after-check read together: a handful of waits, where ResNet-18 has 62 parameters and
    111 operations (not yet run on a GPU when written: the bound is loose on purpose)."""
    import warnings

    model, image = _resnet(), _image()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert tl.validate_model_activations(model, image, random_seed=0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message)]
    assert len(syncs) <= 12, [str(w.message) for w in syncs[:5]]


def test_gradients_on_cuda():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
    history = tl.log_forward_pass(model, torch.randn(4, 8, device="cuda"), save_gradients=True)
    history[history.layer_labels[-1]].activation.sum().backward()
    grad = history["linear_1_1"].gradient
    assert grad is not None and grad.device.type == "cuda" and grad.shape == (4, 16)


def test_output_device_moves_saved_activations():
    history = tl.log_forward_pass(_resnet(), _image(), output_device="cpu")
    saved = [e.activation for e in history.layer_list if e.activation is not None]
    assert saved and all(t.device.type == "cpu" for t in saved)


def test_autocast_bfloat16():
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4)).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        history = tl.log_forward_pass(model, torch.randn(2, 16, device="cuda"))
    assert history["linear_1_1"].activation.dtype == torch.bfloat16
    assert history["linear_1_1"].dtype == torch.bfloat16


def test_save_and_load_a_cuda_history(tmp_path):
    history = tl.log_forward_pass(_resnet(), _image())
    loaded = tl.load(history.save(str(tmp_path / "h")))
    assert loaded.layer_labels == history.layer_labels
    last = history.layer_labels[-1]
    torch.testing.assert_close(loaded[last].activation.cpu(), history[last].activation.cpu())


class _NanAfterRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(torch.relu(self.fc(x)) - 1.0).sum()


def test_find_nonfinite_on_cuda():
    torch.manual_seed(0)
    report = tl.find_nonfinite(_NanAfterRelu().cuda(), torch.randn(8, 4, device="cuda"))
    assert report.found and report.phase == "forward" and report.label.startswith("log")


def test_compare_precision_on_cuda():
    model = nn.Sequential(nn.Linear(32, 32), nn.Softmax(-1), nn.Linear(32, 2)).cuda()
    cmp = tl.compare_precision(model, torch.randn(4, 32, device="cuda"), random_seed=0)
    assert cmp.ranking and len(cmp.rows) >= 3


def test_memory_report_against_the_allocator():
    """The report's estimate of a training step against the allocator's peak during one (SGD
    with momentum: its update runs in place). Two steps first: what the libraries keep for
    themselves (cuBLAS workspaces) and the input are then held before the step, and are taken
    out; the report counts the model's memory, not theirs."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.ReLU()) for _ in range(4)]).cuda()
    x = torch.randn(512, 2048, device="cuda")
    report = tl.memory_report(model, x, optimizer="sgd")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    step()
    torch.cuda.synchronize()
    model_held = report.params + report.optimizer_state  # what stays between steps
    others = torch.cuda.memory_allocated() - model_held
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - others
    assert abs(report.peak_estimate - measured) <= 0.15 * measured, (report.peak_estimate, measured)


def test_log_generate_on_cuda():
    from tiny_llms import gpt2

    model = gpt2().cuda()
    gen = tl.log_generate(model, torch.randint(0, 50, (1, 5), device="cuda"), max_new_tokens=3, do_sample=False)
    assert len(gen.steps) == 3
    assert gen.steps[0].layer_list[-1].activation.device.type == "cuda"


def test_a_model_on_cuda_with_a_cpu_input_fails_with_torch_s_error_and_leaves_torch_as_it_was():
    before = torch.nn.functional.linear
    with pytest.raises(RuntimeError, match="device"):
        tl.log_forward_pass(nn.Linear(4, 4).cuda(), torch.randn(2, 4))
    assert torch.nn.functional.linear is before


def test_a_forward_on_a_side_stream():
    """Ops launched on another stream are copied on that stream, after the op that wrote them."""
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).cuda()
    x = torch.randn(1024, 256, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        history = tl.log_forward_pass(model, x)
        expected = model(x)
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(history[history.layer_labels[-1]].activation, expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_model_split_over_two_devices():
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4).to("cuda:0"), nn.Linear(4, 4).to("cuda:1")

        def forward(self, x):
            return self.b(self.a(x).to("cuda:1"))

    model = Split()
    history = tl.log_forward_pass(model, torch.randn(2, 4, device="cuda:0"))
    assert history["linear_2_3"].activation.device == torch.device("cuda:1")
    assert tl.validate_model_activations(model, torch.randn(2, 4, device="cuda:0"))


def test_a_trace_inside_a_cuda_graph_capture_is_refused():
    model = nn.Linear(4, 4).cuda()
    x = torch.randn(2, 4, device="cuda")
    model(x)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CudaGraphCaptureError, match="CUDA graph"):
        with torch.cuda.graph(graph):
            tl.log_forward_pass(model, x)
    assert not torch.cuda.is_current_stream_capturing()
