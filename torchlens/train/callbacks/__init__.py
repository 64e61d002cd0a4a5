"""``TorchlensCallback`` for training loops that own the loop: Lightning's ``Trainer``
(``torchlens.train.callbacks.lightning``) and the Hugging Face ``Trainer``
(``torchlens.train.callbacks.hf``). Each module needs its framework installed, so this face
imports neither: import the one you use, e.g.
``from torchlens.train.callbacks.lightning import TorchlensCallback``."""

__all__: list = []
