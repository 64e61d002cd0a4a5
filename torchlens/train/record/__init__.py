"""What a logged step records, from the model's hooks: samples of inputs, outputs, gradients and
parameters (``recorder``, drawn by ``sampling``), kept per series as the step's data
(``step_data``) until the writer takes it; the ``updates`` kind (``updates``); and how saturated
the bounded activations are (``saturation``).

Example:
    >>> import torch
    >>> from torchlens.train.record import Sampler
    >>> Sampler(4).values(torch.arange(10.0)).numel()
    4
"""

from .recorder import REASONS, InplaceGradientError, ModelHook, RecorderWiring, StepRecorder
from .sampling import NormsLater, Sampler
from .saturation import SATURATION_EPS, SaturationProbe, read_saturation
from .step_data import Key, Part, StepData
from .updates import UpdateHooks

__all__ = [
    "StepRecorder",
    "RecorderWiring",
    "ModelHook",
    "InplaceGradientError",
    "REASONS",
    "Sampler",
    "NormsLater",
    "SaturationProbe",
    "SATURATION_EPS",
    "read_saturation",
    "StepData",
    "Key",
    "Part",
    "UpdateHooks",
]
