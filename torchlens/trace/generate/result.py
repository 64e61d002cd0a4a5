"""``GenerateHistory``: what ``tl.log_generate`` returns (the tokens and one ``ModelHistory`` per
forward call of ``generate``), saved as a folder of step folders and read back lazily."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator, List, Optional, Union, overload

import torch

from ..history.model_history import ModelHistory
from ..layer_request import LayerKey, entries_for_key
from ..records.tensor_log import TensorLogEntry
from .errors import GenerateArgumentError

STEP_FOLDER = "step_{:04d}"
MANIFEST = "generate.json"
_FORMAT = "torchlens-generate"


class GenerateHistory:
    """The forward passes of one ``generate``: ``steps[0]`` the prefill, ``steps[i]`` the pass
    that chose new token ``i + 1``; ``tokens`` what ``generate`` returned.

    Example:
        >>> import torch, transformers, torchlens as tl
        >>> model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2,
        ...                                                              vocab_size=50)).eval()
        >>> gen = tl.log_generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3,
        ...                       layers_to_save=["lm_head"], do_sample=False, pad_token_id=0)
        >>> gen.layer("lm_head").shape      # 3 steps; generate asks each for the last position's logits only
        torch.Size([3, 1, 1, 50])
        >>> gen.layer("transformer.h.0").shape   # not saved: the error names the steps and the way to save it
        Traceback (most recent call last):
        ...
        ValueError: layer('transformer.h.0'): no saved activation at step(s) 0, 1, 2 (of 3). ...
        >>> gen.new_tokens.shape
        torch.Size([1, 3])
    """

    def __init__(
        self,
        model_name: str,
        tokens: torch.Tensor,
        steps: List[ModelHistory],
        prompt_length: int,
        random_seed: int,
        output: Any = None,
        elapsed: float = 0.0,
    ) -> None:
        self.model_name = model_name
        self.tokens = tokens
        self.steps = steps
        self.prompt_length = prompt_length
        self.random_seed = random_seed
        self.output = tokens if output is None else output  # what generate returned
        self.elapsed = elapsed
        self.notes: List[str] = []

    # ----- the steps ------------------------------------------------------------------------
    @property
    def prefill(self) -> ModelHistory:
        return self.steps[0]

    @property
    def new_tokens(self) -> torch.Tensor:
        """The generated tokens only, ``(batch, new)``."""
        return self.tokens[:, self.prompt_length :]

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[ModelHistory]:
        return iter(self.steps)

    @overload
    def __getitem__(self, step: int) -> ModelHistory: ...

    @overload
    def __getitem__(self, step: slice) -> List[ModelHistory]: ...

    def __getitem__(self, step: Union[int, slice]) -> Union[ModelHistory, List[ModelHistory]]:
        if isinstance(step, slice):
            return self.steps[step]
        if not isinstance(step, int) or isinstance(step, bool):
            raise TypeError(
                f"A GenerateHistory is indexed by step number (gen[0] is the prefill), not {type(step).__name__}; "
                "a layer at a step is gen[step][key], a layer over all steps gen.layer(key)."
            )
        if not -len(self.steps) <= step < len(self.steps):
            raise IndexError(f"step {step} is out of range: this generation has {len(self.steps)} steps (0 = prefill).")
        return self.steps[step]

    def entries(self, key: LayerKey, steps: Optional[slice] = None) -> List[Optional[TensorLogEntry]]:
        """The entry ``key`` names at each step (None where a step has none), as ``gen[i][key]``."""
        out: List[Optional[TensorLogEntry]] = []
        for history in self.steps[steps or slice(None)]:
            try:
                found = entries_for_key(history, key, option="layer")
            except ValueError:
                found = []
            out.append(found[0] if len(found) == 1 else None)
        return out

    def layer(self, key: LayerKey, steps: Optional[slice] = None) -> torch.Tensor:
        """The saved activation of ``key`` over the steps: stacked on a new first dimension when
        all have one shape (decode steps), else concatenated along the one dimension where
        their shapes differ (the prefill's positions, then one per decode step).

        A ``KeyError`` says when ``key`` names nothing at any step (no layer or module of that
        name, as ``gen[step][key]`` says), a ``ValueError`` names the steps where the layer is
        missing or unsaved."""
        entries = self.entries(key, steps)
        chosen = self.steps[steps or slice(None)]
        if entries and all(e is None for e in entries) and all(_names_nothing(h, key) for h in chosen):
            try:
                chosen[0][key]  # its KeyError says so, with close matches
            except KeyError as error:
                raise KeyError(f"layer({key!r}): no step has it. {error.args[0]}") from None
        missing = [i for i, e in enumerate(entries) if e is None or e.activation is None]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            raise ValueError(
                f"layer({key!r}): no saved activation at step(s) {shown} (of {len(entries)}). Save it with "
                f"layers_to_save=[{key!r}], or take a slice of steps that have it: gen.layer({key!r}, steps=slice(1, None))."
            )
        values = [e.activation for e in entries if e is not None]
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) == 1:
            return torch.stack(values)
        ranks = {len(s) for s in shapes}
        differ = {d for s in shapes for d in range(len(s)) for t in shapes if len(s) == len(t) and s[d] != t[d]}
        if len(ranks) == 1 and len(differ) == 1:
            return torch.cat(values, dim=differ.pop())
        raise ValueError(
            f"layer({key!r}): its shapes over the steps ({sorted(shapes)}) differ in more than one dimension; "
            "read them one by one with gen.entries(key)."
        )

    def attention(self, module: str, steps: Optional[slice] = None) -> List[torch.Tensor]:
        """The attention probabilities of one call of ``module`` (``'transformer.h.0.attn'``, as
        ``history.attention``) at each step, from ``log_generate(..., decompose=("sdpa",))``: a
        list, as the shapes differ: the prefill's ``[batch, heads, prompt, prompt]``, then each
        decode step's ``[batch, heads, 1, keys so far]``. ``AttentionNotFoundError`` says what
        to change when a step has none.

        Example:
            >>> import torch, transformers, torchlens as tl
            >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)
            >>> model = transformers.GPT2LMHeadModel(config).eval()
            >>> gen = tl.log_generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2, decompose=("sdpa",),
            ...                       do_sample=False, pad_token_id=0)
            >>> [tuple(p.shape) for p in gen.attention("transformer.h.0.attn")]
            [(1, 2, 3, 3), (1, 2, 1, 4)]
        """
        return [history.attention(module) for history in self.steps[steps or slice(None)]]

    # ----- output ---------------------------------------------------------------------------
    def to_html(self, path: Optional[str] = None, structure_step: Optional[int] = None) -> str:
        """The graph page of one step's structure with a step slider: moving it shows each
        step's shapes and values on the same nodes (see ``page.py``). Returns the HTML."""
        from .page import steps_page  # the renderer loads on first use

        return steps_page(self, path, structure_step)

    def save(self, path: str) -> str:
        """Write every step to ``path/step_0000`` ... (as ``ModelHistory.save``) and the tokens
        to ``path/generate.json``; ``GenerateHistory.load(path)`` reads it back. Returns ``path``."""
        path = os.fspath(path)
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise FileExistsError(f"{path} exists and is not an empty folder; choose a new folder.")
        for i, history in enumerate(self.steps):
            history.save(os.path.join(path, STEP_FOLDER.format(i)))
        write_manifest(self, path)
        return path

    @classmethod
    def load(cls, path: str) -> "GenerateHistory":
        """Open a folder written by ``save`` or ``log_generate(save_to=)``; steps are read lazily."""
        from ..storage import load_history

        path = os.fspath(path)
        try:
            with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise GenerateArgumentError(
                f"{path} has no {MANIFEST}: it is not a folder written by log_generate(save_to=) or GenerateHistory.save."
            ) from None
        if manifest.get("format") != _FORMAT:
            raise GenerateArgumentError(f"{path}/{MANIFEST} is not a torchlens generate manifest.")
        steps = [load_history(os.path.join(path, STEP_FOLDER.format(i))) for i in range(int(manifest["num_steps"]))]
        made = cls(
            model_name=str(manifest["model_name"]),
            tokens=torch.tensor(manifest["tokens"], dtype=torch.long),
            steps=steps,
            prompt_length=int(manifest["prompt_length"]),
            random_seed=int(manifest["random_seed"]),
        )
        made.notes = [str(n) for n in manifest.get("notes", [])]
        return made

    def __repr__(self) -> str:
        saved = sum(h.num_tensors_saved for h in self.steps)
        return (
            f"GenerateHistory({self.model_name}: {len(self.steps)} steps (prefill + {len(self.steps) - 1} decode), "
            f"tokens {tuple(self.tokens.shape)}, {saved} saved activations)"
        )


def write_manifest(result: GenerateHistory, path: str) -> None:
    """``generate.json``: what the step folders do not hold (tokens, prompt length, seed)."""
    os.makedirs(path, exist_ok=True)
    manifest = {
        "format": _FORMAT,
        "version": 1,
        "model_name": result.model_name,
        "num_steps": len(result.steps),
        "tokens": result.tokens.tolist(),
        "prompt_length": result.prompt_length,
        "random_seed": result.random_seed,
        "notes": result.notes,
    }
    with open(os.path.join(path, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f)


def _names_nothing(history: ModelHistory, key: LayerKey) -> bool:
    """``key`` names no layer of ``history`` (saved or not), no module of its model, and is in
    no label (``layers_to_save`` takes substrings)."""
    if not isinstance(key, str):
        return False
    base, _, suffix = key.rpartition(":")
    base = base if suffix.isdigit() else key
    if base in history.modules.types or history.lookup_value(key) is not None:
        return False
    labels = getattr(history, "_all_labels", None) or [e.label for e in history]
    return not any(key.lower() in label or label.rpartition(":")[0] == base for label in labels)


__all__ = ["GenerateHistory", "STEP_FOLDER", "write_manifest"]
