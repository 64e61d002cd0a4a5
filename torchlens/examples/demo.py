"""The first demo: trace AlexNet (random weights), print the summary and one layer.

Run with ``make demo`` or ``python -m torchlens.examples.demo``.
"""
from __future__ import annotations

import torch

import torchlens as tl


def main() -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.alexnet(weights=None)
    x = torch.rand(1, 3, 224, 224)
    history = tl.log_forward_pass(model, x, layers_to_save="all", random_seed=0)
    print(history)
    print()
    print(history["conv2d_3_7"])
    print()
    print("Where conv2d_3_7 was called from:")
    print(history["conv2d_3_7"].func_call_stack[0])
    print()
    subset = tl.log_forward_pass(model, x, layers_to_save=["conv2d_3_7", "features", -5, "linear"])
    print("layers_to_save=['conv2d_3_7', 'features', -5, 'linear'] keeps:", subset.layer_labels)


if __name__ == "__main__":
    main()
