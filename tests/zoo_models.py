"""Builders for the model zoo: real architectures with random weights and small inputs.

``ZOO`` lists :class:`ZooModel` entries. ``entry.build()`` returns ``(model, args, kwargs)``:
a freshly built model (seeded, so two calls give the same weights) and deterministic inputs for
``tl.log_forward_pass(model, args, kwargs)``. Nothing is downloaded: torchvision models are built
with ``weights=None``, HuggingFace models from small configs, timm models with
``pretrained=False``.

Used by ``tests/test_zoo.py`` and ``benchmarks/zoo_table.py``. ``seconds`` is the measured
wall time of one zoo test of the entry on the 2-core CI machine (build + validate + two counts);
entries at or above ``SLOW_SECONDS`` are marked ``slow`` by the tests.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

Built = Tuple[nn.Module, tuple, Dict[str, Any]]

SLOW_SECONDS = 2.0
SEED = 0


@dataclass(frozen=True)
class ZooModel:
    name: str                       # unique id, e.g. "tv.resnet18"
    family: str                     # see FAMILIES
    build: Callable[[], Built]
    seconds: float = 0.0            # measured time of one zoo test (see module docstring)
    xfail: Optional[str] = None     # a known torchlens bug: the reason (tests use strict xfail)
    note: str = ""                  # input size / configuration, for the table

    @property
    def slow(self) -> bool:
        return self.seconds >= SLOW_SECONDS


FAMILIES = ("classification", "detection", "segmentation", "video", "optical_flow",
            "transformers", "timm", "recurrent")


def _seeded(build: Callable[[], Built]) -> Callable[[], Built]:
    def wrapped() -> Built:
        torch.manual_seed(SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, args, kwargs = build()
        return model, tuple(args), dict(kwargs)
    wrapped.__name__ = getattr(build, "__name__", "build")
    return wrapped


def _images(*shape: int) -> torch.Tensor:
    return torch.rand(*shape)


# ----- torchvision classification ---------------------------------------------------------------
# model name -> (input size (H = W), extra builder keyword arguments). Default: 64 x 64.
_TV_CLASSIFICATION_SPECIAL: Dict[str, Tuple[int, Dict[str, Any]]] = {
    "googlenet": (64, dict(aux_logits=False, init_weights=True)),
    "inception_v3": (75, dict(aux_logits=False, init_weights=True)),
    "maxvit_t": (224, {}),
    **{name: (32, dict(image_size=32)) for name in ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32")},
    "vit_h_14": (28, dict(image_size=28)),
}


def _tv_classification(name: str, train: bool = False) -> Callable[[], Built]:
    size, extra = _TV_CLASSIFICATION_SPECIAL.get(name, (64, {}))

    def build() -> Built:
        import torchvision
        model = torchvision.models.get_model(name, weights=None, **extra)
        model.train(train)
        return model, (_images(1, 3, size, size),), {}
    return _seeded(build)


def tv_classification_names() -> List[str]:
    import torchvision
    return list(torchvision.models.list_models(module=torchvision.models))


# ----- the zoo ----------------------------------------------------------------------------------
def _zoo() -> List[ZooModel]:
    zoo: List[ZooModel] = []
    for name in tv_classification_names():
        size, extra = _TV_CLASSIFICATION_SPECIAL.get(name, (64, {}))
        zoo.append(ZooModel(f"tv.{name}", "classification", _tv_classification(name),
                            note=f"1x3x{size}x{size}, eval"))
    return zoo


ZOO: List[ZooModel] = _zoo()
ZOO_BY_NAME: Dict[str, ZooModel] = {entry.name: entry for entry in ZOO}
