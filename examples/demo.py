"""The main demo: trace a recurrent model, AlexNet and a ResNet; print what torchlens sees and
write their drawings into ``demo_out/``; then watch a short training run of the ResNet and
write its explorer page (``demo_out/explorer.html``).

Run with ``make demo`` or ``python -m examples.demo [output folder]``.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

import torchlens as tl

from .models import SimpleRecurrent


def _banner(title: str) -> None:
    print("\n" + "=" * 100 + f"\n{title}\n" + "=" * 100)


def _draw(history: tl.ModelHistory, outdir: str, name: str, **options) -> str:
    path = os.path.join(outdir, name)
    try:
        tl.render_graph(history, vis_outpath=path, vis_fileformat="svg", vis_save_only=True, **options)
    except tl.GraphvizNotFoundError as error:
        print(f"(drawing skipped: {error})")
        return ""
    return path + ".svg"


def main(outdir: str = "demo_out") -> None:
    import torchvision

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    written = []

    _banner("1. A recurrent model: the same layer applied four times")
    recurrent = SimpleRecurrent()
    history = tl.log_forward_pass(recurrent, torch.rand(6, 5), random_seed=0)
    print(history)
    print("\nThe second pass of the linear layer, history['linear_1_1:2']:")
    print(history["linear_1_1:2"])
    written.append(_draw(history, outdir, "recurrent_rolled", vis_mode="rolled"))
    written.append(_draw(history, outdir, "recurrent_unrolled", vis_mode="unrolled"))

    _banner("2. AlexNet (random weights), every operation")
    alexnet = torchvision.models.alexnet(weights=None)
    x = torch.rand(1, 3, 224, 224)
    history = tl.log_forward_pass(alexnet, x, random_seed=0)
    print(history)
    print()
    print(history["conv2d_3_7"])
    print("\nWhere conv2d_3_7 was called from (the outermost frame):")
    print(history["conv2d_3_7"].func_call_stack[0])
    subset = tl.log_forward_pass(alexnet, x, layers_to_save=["conv2d_3_7", "features", -5, "linear"])
    print("\nlayers_to_save=['conv2d_3_7', 'features', -5, 'linear'] keeps:", subset.layer_labels)
    written.append(_draw(history, outdir, "alexnet", vis_mode="unrolled"))

    _banner("3. ResNet-18: skip connections, nested modules, validation")
    resnet = torchvision.models.resnet18(weights=None)
    x = torch.rand(1, 3, 64, 64)
    history = tl.log_forward_pass(resnet, x, random_seed=0)
    print(history)
    ok = tl.validate_model_activations(resnet, x, random_seed=0)
    print(f"\nvalidate_model_activations(resnet18): {ok}")
    written.append(_draw(history, outdir, "resnet18", vis_mode="unrolled"))
    written.append(_draw(history, outdir, "resnet18_depth1", vis_mode="unrolled", vis_nesting_depth=1))

    _banner("4. Watching a small training run: histograms of every module call over 20 steps")
    from torchlens.train.serve import export_html

    run_dir = os.path.join(outdir, "resnet18_run")
    with tl.watch(resnet, run_dir=run_dir, backend=None, log_freq=2) as w:
        optimizer = torch.optim.SGD(resnet.parameters(), lr=0.05, momentum=0.9)
        for _ in range(20):
            images, labels = torch.rand(8, 3, 32, 32), torch.randint(0, 1000, (8,))
            loss = nn.functional.cross_entropy(resnet(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    run = tl.open_run(w.run_dir)
    grads = run.series("layer1.0.conv1:1", "params_grad", "weight")
    print(f"{len(run.calls)} module calls, logged steps {run.steps.tolist()}")
    print(
        "layer1.0.conv1 weight gradients, range per logged step: "
        + ", ".join(f"[{lo:.2g}, {hi:.2g}]" for lo, hi in zip(grads.min, grads.max))
    )
    written.append(export_html(run_dir, os.path.join(outdir, "explorer.html")))
    print(
        f"The explorer page of this run, one file: {os.path.abspath(written[-1])}"
        f"\n(or serve it live: torchlens explore {run_dir})"
    )

    _banner("Files written")
    for path in filter(None, written):
        print(f"  {os.path.abspath(path)}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
