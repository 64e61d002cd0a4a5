"""``tl.log_generate``: HuggingFace's own ``model.generate`` runs, and each forward call it
makes (the prefill, then one per new token) is traced into a ``ModelHistory``.

How: for the length of ``generate`` the model's ``forward`` is replaced by a function with the
original's signature (an instance attribute; the model's own is put back afterwards) that runs
``_Steps.step``. Each call is traced by the usual pass
(``capture.run.run_pass``) and post-processed into a history, and its output is handed back to
``generate``, which goes on exactly as without torchlens: the pass restores the caller's random
number generators, so sampling draws the same numbers as a plain ``generate``.

Structure reuse: a step is keyed by its shape (the kwargs' names, the cache's type, the shape of
``input_ids``); every decode step shares one key. The first step of each key is traced fully.
When only module outputs are requested (``layers_to_save=['lm_head']``), the later ones run the
model's plain forward with hooks on the requested modules only: their entries are the first
step's (labels, parents, module boxes) with the new values, shapes and dtypes, and their
sequence of module calls is checked against the traced one. When only metadata is requested
(``layers_to_save=None``), they run with the lean tracer (``capture/lean.py``, ``lean.py`` here):
every operation is recorded with its own shape, dtype, size and time, and checked against the
traced step's (function, parents, parameters, module stack, call site) before its structure is
used. A step that ran differently raises ``StepStructureError`` (it cannot be traced again: its
forward has run and changed the cache); ``reuse_structure=False`` traces every step.
``decompose=("sdpa",)`` traces every step fully too (its attention runs as its math in each;
neither the plain forward nor the lean tracer runs decompositions).
"""

from __future__ import annotations

import copy
import functools
import os
import random
from time import perf_counter
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import torch
from torch import nn

from ...arguments import PathExistsError, check_arguments
from ..capture import (
    FastPathOff,
    HeldWrappers,
    ModelInventory,
    PassSession,
    RngState,
    SavePlan,
    check_decompose,
    decompositions,
    eager_only,
    seed_everything,
    tensors_in,
    traced_addresses,
)
from ..history.index import build_lookup
from ..history.model_history import ModelHistory
from ..input_copy import require_model
from ..layer_request import LayerKey, LayerRequest, entries_for_key, parse_request
from ..postprocess import drop_unsaved
from ..records.meta import refuse_meta
from ..traced_pass import traced_pass
from .errors import GenerateArgumentError, NotGenerativeError, StepStructureError
from .lean import Structure, calls_differ, check, lean_history
from .result import STEP_FOLDER, GenerateHistory, write_manifest

_ROOT_HOOKS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)
_SHAPED_INPUTS = ("input_ids", "inputs_embeds", "decoder_input_ids", "decoder_inputs_embeds")


def _step_key(args: tuple, kwargs: dict) -> Tuple[Any, ...]:
    """Steps with one key run the same operations (HF decode steps differ only in cache length)."""
    named = tuple(sorted((name, type(v).__name__) for name, v in kwargs.items() if v is not None))
    shapes = tuple(
        (name, tuple(kwargs[name].shape)) for name in _SHAPED_INPUTS if isinstance(kwargs.get(name), torch.Tensor)
    )
    positional = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
    # a cache's first use fills it (an encoder-decoder's cross-attention keys are computed once)
    empty = tuple(name for name, v in kwargs.items() if callable(getattr(v, "get_seq_length", None)) and _empty(v))
    return named, shapes, positional, empty


def _empty(cache: Any) -> bool:
    try:
        return int(cache.get_seq_length()) == 0
    except Exception:  # a cache type that cannot say: the key does without
        return False


def _describe(entry: Any, tensor: torch.Tensor) -> None:
    entry.shape, entry.dtype = tensor.shape, tensor.dtype
    entry.nbytes = tensor.nelement() * tensor.element_size()
    entry.grad_fn_name = type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None


class _Template:
    """The traced step a key's later steps reuse: its history, the module calls it made, and
    where each saved entry sits in a module's output."""

    def __init__(self, index: int, history: ModelHistory, calls: List[str], plan: SavePlan) -> None:
        self.index = index
        self.history = history
        self.calls = calls
        self.labels = list(history.layer_labels)  # of every entry, before unsaved ones are dropped
        self.chosen: frozenset = frozenset()
        self.structure: Optional[Structure] = None  # for lean steps (metadata only)
        self.where: Dict[Tuple[str, int, Any], Any] = {}  # (address, pass, position) -> entry
        for e in history.layer_list:
            for (address, n), position in (e.module_output_positions or {}).items():
                if plan.wants_module(address, n):
                    self.where.setdefault((address, n, position), e)


class _Steps:
    """The forward calls of one ``generate``, traced one by one (see the module docstring)."""

    def __init__(self, model: nn.Module, request: LayerRequest, options: Dict[str, Any]) -> None:
        self.model = model
        self.request = request
        self.options = options
        self.seed: int = options["seed"]
        self.keep_unsaved: bool = options["keep_unsaved"]
        self.save_to: Optional[str] = options["save_to"]
        self.original = model.forward  # the class's bound forward, or a wrapper of its own (accelerate's)
        self.own_forward = vars(model).get("forward")  # put back afterwards, and in place during a pass
        self.steps: List[ModelHistory] = []
        self.templates: Dict[Tuple[Any, ...], _Template] = {}
        self.matched_keys: set = set()
        self.decompositions = decompositions(options["decompose"])
        reuse = options["reuse_structure"] and not self.decompositions  # a reused step would run fused
        self.fast = (
            reuse
            and bool(request.modules)
            and not (request.save_all or request.type_substrings or request.addresses or request.needs_labels)
            and not self.keep_unsaved
        )
        # metadata only: later steps of a key run with the lean tracer (capture/lean.py)
        self.lean = reuse and request.saves_nothing and self.keep_unsaved
        self.lean_steps: List[int] = []
        inventory = ModelInventory.of(model)
        self.addresses = inventory.module_addresses  # id -> address
        names = {m if isinstance(m, str) else m[0] for m in request.modules}
        self.wanted = {i: a for i, a in self.addresses.items() if a in names}  # module id -> address
        self.calls: Optional[List[str]] = None  # module calls of the step in progress
        self.session = PassSession()  # the model's inventory and bound torch functions, found once
        # the wrappers stay in place from step to step when most steps are passes (not self.fast)
        self.held: Optional[HeldWrappers] = None

        # generate reads forward's signature (it passes logits_to_keep, position_ids only where
        # accepted): the replacement shows the original's
        @functools.wraps(self.original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self.step(*args, **kwargs)

        self.forward = forward

    def restore_forward(self) -> None:
        """The model's ``forward`` as it was before ``log_generate``."""
        if self.own_forward is not None:
            vars(self.model)["forward"] = self.own_forward  # an instance attribute: nn.Module's setattr adds nothing
        else:
            vars(self.model).pop("forward", None)

    # ----- what replaces model.forward ----------------------------------------------------------
    def step(self, *args: Any, **kwargs: Any) -> Any:
        index = len(self.steps)
        key = _step_key(args, kwargs)
        template = self.templates.get(key)
        stream = self._stream(index)
        with stream if stream is not None else _Nothing():
            if self.fast and template is not None:
                history, output = self._fast_step(index, template, args, kwargs, stream=stream)
            elif template is not None and template.structure is not None:
                history, output = self._lean_step(index, template.structure, args, kwargs, stream=stream)
            else:
                history, output = self._traced_step(index, key, args, kwargs, stream=stream)
            if stream is not None:
                with self.held.released() if self.held is not None else _Nothing():  # saving looks torch up by name
                    history = stream.finish(history)
        self.steps.append(history)
        return output

    def _stream(self, index: int) -> Any:
        if self.save_to is None:
            return None
        from ..storage import StreamedSave  # storage loads on first use

        return StreamedSave(os.path.join(self.save_to, STEP_FOLDER.format(index)))

    def _plan(self, stream: Any, **which: Any) -> SavePlan:
        make = SavePlan if stream is None else stream.plan
        return make(
            output_device=self.options["output_device"],
            activation_postfunc=self.options["activation_postfunc"],
            detach=self.options["detach"],
            **which,
        )

    def _request_plan(self, stream: Any, template: Optional[_Template]) -> SavePlan:
        request = self.request
        if request.needs_labels:  # the first step of a key saves all and keeps what the keys name
            if template is None:
                return self._plan(stream, save_all=True)
            return self._plan(stream, raw_indices=template.chosen)
        return self._plan(
            stream,
            save_all=request.save_all,
            type_substrings=request.type_substrings,
            modules=request.modules,
            addresses=request.addresses,
        )

    def _record_calls(self, module: nn.Module, args: Any) -> None:
        if self.calls is not None:
            address = self.addresses.get(id(module))
            if address:
                self.calls.append(address)

    def _pass(self, index: int, args: tuple, kwargs: dict, plan: SavePlan, lean: bool = False) -> Any:
        """The step's pass (a ``TracedPass``: records, history, the model's output) and the module
        calls it made."""
        model = self.model
        self.restore_forward()  # the pass calls the model's own forward

        # the root's own hooks ran around this call already (generate called the model): not again inside
        own = vars(model)
        own_hooks = {name: own[name] for name in _ROOT_HOOKS if own.get(name)}
        for name, hooks in own_hooks.items():
            own[name] = type(hooks)()
        calls: List[str] = []
        self.calls = calls
        recorder = nn.modules.module.register_module_forward_pre_hook(self._record_calls)
        hooks = [self.decompositions] if self.decompositions is not None else []
        try:
            traced = traced_pass(
                model, args, kwargs, plan, seed=self.seed + index, hooks=hooks, lean=lean, session=self.session
            )
        finally:
            recorder.remove()
            self.calls = None
            own.update(own_hooks)
            own["forward"] = self.forward
        return traced, calls

    def _traced_step(self, index: int, key: Tuple[Any, ...], args: tuple, kwargs: dict, stream: Any) -> Any:
        template = self.templates.get(key)
        plan = self._request_plan(stream, template)
        traced, calls = self._pass(index, args, kwargs, plan)
        result, output = traced.result, traced.output
        structure = Structure(index, result, calls) if self.lean and template is None else None
        history = traced.history  # post-processed after the structure read the raw records
        for note in history.notes:
            if note not in self.options["notes"]:
                self.options["notes"].append(note)
        if template is None:
            template = _Template(index, history, calls, plan)
            if structure is not None:
                structure.set_history(history)
                template.structure = structure
            if self.request.needs_labels:
                template.chosen = frozenset(self._resolve(history))
                for e in history.layer_list:
                    if e.raw_index not in template.chosen:
                        e.activation = None
            self.templates[key] = template
        elif self.request.needs_labels and history.layer_labels != template.labels:
            raise StepStructureError(
                f"log_generate: step {index} ran different operations from step {template.index} (same input shapes), "
                "so the layer labels in layers_to_save name different operations in them. Use module addresses "
                "('lm_head', 'model.layers.0') or layer-type substrings, which are found in each step as it runs."
            )
        if not self.request.needs_labels:
            self._resolve(history)
        if not self.keep_unsaved:
            history = drop_unsaved(history)
        return history, output

    def _lean_step(self, index: int, structure: Structure, args: tuple, kwargs: dict, stream: Any) -> Any:
        traced, calls = self._pass(index, args, kwargs, self._plan(stream), lean=True)
        start = perf_counter()
        check(index, structure, traced.result, calls)
        self.lean_steps.append(index)
        return lean_history(structure, traced.result, start), traced.output

    def _resolve(self, history: ModelHistory) -> Set[int]:
        """Entries the request's keys name in this step; keys no step matches fail at the end."""
        chosen: Set[int] = set()
        for k in self.request.keys:
            try:
                found = entries_for_key(history, k)
            except ValueError:
                continue
            self.matched_keys.add(k)
            chosen.update(e.raw_index for e in found)
        return chosen

    def _fast_step(self, index: int, template: _Template, args: tuple, kwargs: dict, stream: Any) -> Any:
        plan = self._request_plan(stream, template)
        saved: Dict[Tuple[str, int, Any], Tuple[Any, torch.Tensor]] = {}
        passes: Dict[str, int] = {}

        def keep(module: nn.Module, a: Any, output: Any) -> None:
            address = self.wanted.get(id(module))
            if address is None or self.calls is None:
                return
            n = passes[address] = passes.get(address, 0) + 1
            for position, tensor in tensors_in(output):
                entry = template.where.get((address, n, position))
                if entry is not None and (address, n, position) not in saved:
                    saved[(address, n, position)] = (plan.copy(tensor, entry), tensor)

        calls = self.calls = []
        start = perf_counter()
        rng = RngState()
        hooks = [
            nn.modules.module.register_module_forward_pre_hook(self._record_calls),
            nn.modules.module.register_module_forward_hook(keep),
        ]
        try:
            seed_everything(self.seed + index)  # as a traced step: seeded, the caller's generators kept
            output = self.original(*args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
            self.calls = None
            rng.restore()
        if calls != template.calls:
            raise calls_differ(index, template.index, calls, template.calls)
        by_entry = {id(template.where[k]): made for k, made in saved.items()}
        entries = []
        for e in template.history.layer_list:
            new = copy.copy(e)
            made = by_entry.get(id(e))
            if made is not None:
                new.activation = made[0]
                _describe(new, made[1])
            entries.append(new)
        history = copy.copy(template.history)
        history.replace_entries(entries, build_lookup(entries, template.history.modules.passes))
        history.random_seed = self.seed + index
        history.pass_time = perf_counter() - start
        history.postprocess_time = 0.0
        history.notes = list(template.history.notes) + [
            f"log_generate: this step ran the model's plain forward with hooks on the requested modules only; its "
            f"entries are step {template.index}'s (same input shapes and module calls) with this step's values. Pass "
            "reuse_structure=False to trace every operation of every step."
        ]
        return history, output


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _model_device(model: nn.Module) -> Optional[torch.device]:
    for tensor in [*model.parameters(), *model.buffers()][:1]:
        return tensor.device
    return None


def _check(model: Any, input_ids: Any, max_new_tokens: Any) -> None:
    require_model(model, "log_generate")
    if not callable(getattr(model, "generate", None)):
        raise NotGenerativeError(
            f"log_generate drives the model's own `generate` method (HuggingFace's GenerationMixin), and "
            f"{type(model).__name__} has no `generate`. Trace a plain module's calls with tl.log_forward_pass."
        )
    if max_new_tokens is None:
        raise GenerateArgumentError(
            "log_generate needs max_new_tokens (a positive int, e.g. max_new_tokens=50): it bounds how many "
            "forward passes are traced."
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise GenerateArgumentError(f"log_generate: max_new_tokens must be a positive int, not {max_new_tokens!r}.")
    if not isinstance(input_ids, torch.Tensor):
        raise GenerateArgumentError(
            f"log_generate: input_ids must be a tensor of token ids (batch, length), not {type(input_ids).__name__}."
        )
    device = _model_device(model)
    if device is not None and (device.type == "meta") != (input_ids.device.type == "meta"):
        raise GenerateArgumentError(
            f"log_generate: the model's parameters are on {device} and input_ids on {input_ids.device}. Put both on "
            "the same device; generate needs real values to choose tokens, so neither may be on meta."
        )
    if input_ids.device.type == "meta":
        raise refuse_meta("log_generate (generate chooses each token from the values of the logits)")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise GenerateArgumentError(f"log_generate: input_ids must hold token ids (integers), not {input_ids.dtype}.")
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and input_ids.shape[-1] + max_new_tokens > limit:
        raise GenerateArgumentError(
            f"log_generate: max_new_tokens={max_new_tokens} with a prompt of {input_ids.shape[-1]} tokens goes "
            f"past the model's {limit} positions (config.max_position_embeddings)."
        )


def log_generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: Optional[int] = None,
    layers_to_save: Union[str, None, List[LayerKey]] = "all",
    keep_unsaved_layers: Optional[bool] = None,
    output_device: Union[str, torch.device] = "same",
    activation_postfunc: Optional[Callable[[torch.Tensor], Any]] = None,
    detach_saved_tensors: bool = False,
    random_seed: Optional[int] = None,
    save_to: Optional[str] = None,
    reuse_structure: bool = True,
    decompose: Union[None, str, Tuple[str, ...]] = None,
    **generate_kwargs: Any,
) -> GenerateHistory:
    """Run ``model.generate(input_ids, max_new_tokens=..., **generate_kwargs)`` and trace every
    forward call it makes: the prefill, then one per new token.

    Args:
        model: a HuggingFace model with ``generate`` (any ``GenerationMixin``).
        input_ids: the prompt, ``(batch, length)``.
        max_new_tokens: how many tokens to generate (required: it bounds the passes traced).
        layers_to_save, keep_unsaved_layers, output_device, activation_postfunc,
            detach_saved_tensors: as in ``log_forward_pass``, for each step. Module addresses
            (``['lm_head']``) are cheapest: see ``reuse_structure``.
        random_seed: seeds each step's pass (step ``i`` gets ``random_seed + i``; chosen at
            random if None). The caller's generators are restored after each pass, so
            ``generate`` samples exactly as it would without torchlens: seed them yourself
            (``torch.manual_seed``) as for a plain ``generate``.
        save_to: a folder: each step is streamed to ``save_to/step_0000`` ... as
            ``log_forward_pass(save_to=)`` does, and the result reads them lazily
            (``GenerateHistory.load(save_to)`` opens it again).
        reuse_structure: steps with the input shapes of an earlier traced step reuse its
            structure. With only module outputs requested they run untraced with hooks on those
            modules (checked against the sequence of module calls); with only metadata
            (``layers_to_save=None``) they run with a lean tracer that records each operation's
            shape, dtype, size and time (checked operation by operation: function, parents,
            parameters, modules, call site). A step that ran differently raises
            ``StepStructureError``. False: trace every step fully.
        decompose: ``("sdpa",)``: in every step, ``F.scaled_dot_product_attention`` runs as its
            math, so the attention probabilities are layers (type ``attnsoftmax``), as in
            ``log_forward_pass``: ``gen.attention(module)`` gives them step by step,
            ``gen[i].attention(module)`` one step's. Every step is then traced fully.
        **generate_kwargs: passed to ``generate`` (``do_sample``, ``top_k``, ``use_cache``,
            ``cache_implementation``, ``pad_token_id`` ...).

    Example:
        >>> import torch, transformers, torchlens as tl
        >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)
        >>> model = transformers.GPT2LMHeadModel(config).eval()
        >>> gen = tl.log_generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=4,
        ...                       layers_to_save=["lm_head"], do_sample=False, pad_token_id=0)
        >>> len(gen.steps), gen.tokens.shape, gen[1]["lm_head"].activation.shape
        (4, torch.Size([1, 7]), torch.Size([1, 1, 50]))
    """
    _check(model, input_ids, max_new_tokens)
    check_arguments("log_generate", locals())  # flags, seed, save_to, postfunc: torchlens/arguments.py
    decomposed = check_decompose(decompose)
    if isinstance(layers_to_save, str) and layers_to_save in ("all", "none") or layers_to_save is None:
        request = parse_request(layers_to_save, ())
    else:
        module_addresses, buffer_addresses = traced_addresses(model)
        request = parse_request(layers_to_save, module_addresses, buffer_addresses)
    if keep_unsaved_layers is None:
        keep_unsaved_layers = request.save_all or request.saves_nothing
    if output_device not in ("same", None):
        torch.device(output_device)
    if save_to is not None:
        save_to = os.fspath(save_to)
        if os.path.exists(save_to) and (not os.path.isdir(save_to) or os.listdir(save_to)):
            raise PathExistsError(
                f"save_to: {save_to} exists and is not an empty folder; choose a new folder (nothing is overwritten)."
            )
    seed = random.SystemRandom().randrange(2**31) if random_seed is None else int(random_seed)
    notes: List[str] = []
    steps = _Steps(
        model,
        request,
        dict(
            seed=seed,
            keep_unsaved=keep_unsaved_layers,
            save_to=save_to,
            reuse_structure=reuse_structure,
            output_device=output_device,
            activation_postfunc=activation_postfunc,
            detach=detach_saved_tensors,
            notes=notes,
            decompose=decomposed,
        ),
    )
    if hasattr(getattr(model, "generation_config", None), "disable_compile"):
        # HF compiles the forward on GPUs with a static cache: the operations must run eagerly to be seen
        generate_kwargs.setdefault("disable_compile", True)
    start = perf_counter()
    model.forward = steps.forward
    try:
        generate: Any = model.generate
        # compiled submodules run their Python code, as in log_forward_pass; unless most steps run
        # untraced (steps.fast), the wrappers stay in place from step to step (inactive between them)
        with (
            eager_only(),
            FastPathOff(bool(decomposed)),
            HeldWrappers() if not steps.fast else _Nothing() as steps.held,
        ):
            output = generate(input_ids, max_new_tokens=max_new_tokens, **generate_kwargs)
    finally:
        steps.restore_forward()
    missing = [k for k in request.keys if k not in steps.matched_keys]
    if missing:
        raise ValueError(f"layers_to_save: {missing} match no layer label, module address or substring in any step.")
    tokens = output if isinstance(output, torch.Tensor) else output.sequences
    result = GenerateHistory(
        model_name=type(model).__name__,
        tokens=tokens,
        steps=steps.steps,
        # what precedes the new tokens: the prompt, or an encoder-decoder's decoder start token
        prompt_length=max(tokens.shape[-1] - len(steps.steps), 0),
        random_seed=seed,
        output=output,
        elapsed=perf_counter() - start,
    )
    result.notes.extend(notes)
    if steps.lean_steps:
        result.notes.append(
            f"log_generate: {len(steps.lean_steps)} of {len(steps.steps)} steps (those with the input shapes of an "
            "earlier step) were recorded leanly: their own shapes, dtypes, sizes and times on the structure of the "
            "first step of their shapes (labels, edges, module boxes, source lines), after checking that the same "
            "operations ran with the same parents, parameters, modules and call sites. Pass reuse_structure=False to "
            "trace every step fully."
        )
    if save_to is not None:
        write_manifest(result, save_to)
    return result


__all__ = ["log_generate"]
