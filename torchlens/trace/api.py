"""The public entry points: ``log_forward_pass``, ``get_model_metadata`` and
``validate_model_activations`` (which traces, so it lives here, above ``validate``)."""

from __future__ import annotations

import contextlib
import random
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..arguments import ArgumentValueError, check, check_arguments
from .capture import (
    BufferSnapshot,
    FastPathOff,
    MemoryCheck,
    MetaCopies,
    ModelInventory,
    PassHook,
    PassSession,
    RngState,
    SavePlan,
    automatic_collection_paused,
    check_decompose,
    check_device,
    compiled_function_notes,
    decompositions,
    eager_only,
    inputs_on,
    is_meta_pass,
    refuse_meta,
    seed_everything,
    tensors_in,
    traceable_model,
    traced_addresses,
)
from .draw_options import DrawOptions, log_draw
from .history.model_history import ModelHistory
from .input_copy import as_args, as_kwargs, copy_inputs
from .input_copy import require_model as require_model  # show_model_graph checks its model with it too
from .intervene import check_applied, check_intervene, plan_interventions
from .layer_request import LayerKey, parse_request, resolve_request
from .postprocess import drop_unsaved
from .records.meta import MetaDeviceError
from .traced_pass import traced_pass
from .verdicts import unequal


def _streamed_save(path: Any, save_gradients: bool) -> Any:
    """``save_to=``: activations written to a folder as they are made (storage loads on first use)."""
    from .storage import StreamedSave

    return StreamedSave(path, save_gradients)


def _check_meta_model(inventory: ModelInventory, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """A model on ``meta`` (its parameters and buffers: ``inventory``) called with real inputs:
    say so, naming both devices, instead of torch's "Tensor on device meta is not on the
    expected device cpu!" from inside the pass."""
    meta = next((t for t in inventory.parameters + inventory.buffers if t.is_meta), None)
    if meta is None:
        return
    on_meta = inventory.param_addresses.get(id(meta)) or inventory.buffer_addresses[id(meta)]
    devices = sorted({str(t.device) for _, t in tensors_in((args, kwargs)) if not t.is_meta})
    if devices:
        raise MetaDeviceError(
            f"log_forward_pass: the model's parameters are on the meta device ({on_meta}, and maybe others: shapes "
            f"without values) and its input on {' and '.join(devices)}. Pass device='meta' to trace every "
            "operation's shape and dtype without values (torchlens then copies the input to meta), or give the "
            f"model real weights first (model.to_empty(device={devices[0]!r}), then load_state_dict)."
        )


def log_forward_pass(
    model: nn.Module,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    layers_to_save: Union[str, None, List[LayerKey]] = "all",
    keep_unsaved_layers: Optional[bool] = None,
    output_device: Union[str, torch.device] = "same",
    activation_postfunc: Optional[Callable[[torch.Tensor], Any]] = None,
    detach_saved_tensors: bool = False,
    save_function_args: bool = False,
    save_gradients: bool = False,
    random_seed: Optional[int] = None,
    vis_mode: Optional[str] = None,
    vis_nesting_depth: Optional[int] = None,
    vis_outpath: Optional[str] = None,
    vis_fileformat: Optional[str] = None,
    vis_save_only: Optional[bool] = None,
    vis_direction: Optional[str] = None,
    intervene: Optional[Dict[LayerKey, Callable[[torch.Tensor, Any], torch.Tensor]]] = None,
    save_to: Optional[str] = None,
    device: Optional[str] = None,
    decompose: Union[None, str, Tuple[str, ...]] = None,
    draw: Optional[DrawOptions] = None,
) -> ModelHistory:
    """Run one forward pass of ``model`` and return the log of every tensor operation in it.

    Args:
        model: any ``torch.nn.Module``.
        input_args: a tensor, or a list/tuple of positional arguments (nested containers of
            tensors and other values are fine).
        input_kwargs: keyword arguments for ``forward``.
        layers_to_save: ``'all'``; ``None``/``'none'``/``[]`` for metadata only; or a list of
            layer labels (``'conv2d_3_7'``, ``'linear_1_1:2'``), module addresses
            (``'features'``), input/output/buffer addresses (``'input.x'``,
            ``'output.logits'``), ordinals (``-5``) and label substrings (``'conv'``): any key
            ``history[...]`` accepts.
        keep_unsaved_layers: keep entries whose activation was not saved. Default: ``True``
            unless a subset of layers was requested.
        output_device: ``'same'`` (where the tensor was), ``'cpu'``, or any device.
        activation_postfunc: applied to each saved activation (e.g. ``lambda t: t.mean(0)``).
        detach_saved_tensors: save detached copies (no autograd history).
        save_function_args: keep each operation's arguments, so it can be re-run.
        save_gradients: after you call ``.backward()`` on the output (or on any saved
            activation, or a loss built from them), each layer the gradient flowed through
            has it in ``entry.gradient``.
        random_seed: seeds python, numpy and torch for the pass (chosen at random if None;
            recorded as ``history.random_seed``). The caller's RNG state is restored afterwards.
        vis_mode: ``'none'`` (or None), ``'unrolled'`` (one node per pass) or ``'rolled'`` (one
            node per layer) to also draw the graph; ``vis_nesting_depth``, ``vis_outpath``,
            ``vis_fileformat``, ``vis_save_only`` and ``vis_direction`` are the other fields of
            ``DrawOptions`` (None: its default). The older spelling of ``draw=``.
        intervene: ``{key: fn}``: the output of each layer a key names (keys as in
            ``layers_to_save``; ``'relu_1_2:2'`` for one pass) is replaced, during the pass, by
            ``fn(activation, entry)`` before anything downstream uses it; those entries get
            ``entry.intervened``. Costs one extra, metadata-only pass to resolve the keys.
        save_to: a folder: each saved activation is written there (safetensors shards) as soon
            as it is produced, so memory stays near that of a plain forward pass; the history
            returned is ``torchlens.load(save_to)``.
        device: ``'meta'``: run the pass on meta copies of the parameters and buffers (no memory
            copied; the model is left untouched) and meta copies of the inputs: every operation,
            shape and dtype without values, for a model whose activations would not fit.
        decompose: ``("sdpa",)``: run ``F.scaled_dot_product_attention`` calls (HF models,
            ``nn.MultiheadAttention``) as their math, so the attention probabilities are ops
            (layer type ``attnsoftmax``; ``history.attention(module)``). Output equal to the
            fused one within rounding (README: Attention patterns). Off by default.
        draw: a ``torchlens.DrawOptions``: also draw the graph (mode, nesting depth, direction,
            output path without extension, file format, whether to skip opening a viewer). Not
            together with the ``vis_*`` keywords (an ``ArgumentValueError``).

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> history = tl.log_forward_pass(model, torch.rand(2, 4))
        >>> history['relu_1_2'].activation.shape
        torch.Size([2, 3])
    """
    require_model(model, "log_forward_pass")
    check_arguments("log_forward_pass", locals())  # flags, seed, paths, functions: torchlens/arguments.py
    # TorchScript is refused; torch.compile'd: the original module. Its inventory serves the
    # checks below and the (first) pass: one walk of the model's modules in all
    model, notes, inventory = traceable_model(model)
    vis = dict(vis_mode=vis_mode, vis_nesting_depth=vis_nesting_depth, vis_direction=vis_direction)
    vis.update(vis_outpath=vis_outpath, vis_fileformat=vis_fileformat, vis_save_only=vis_save_only)
    drawing = log_draw(draw, vis)  # None: no drawing
    if detach_saved_tensors and save_gradients:
        raise ArgumentValueError(
            "detach_saved_tensors=True and save_gradients=True cannot be combined: gradients are recorded when "
            "you call .backward() through the saved activations (e.g. history[history.output_layers[0]]"
            ".activation.sum().backward()), and detached copies have no autograd graph to carry them. Use "
            "save_gradients=True alone (the saved copies then keep their graph), or detach_saved_tensors=True alone."
        )
    if output_device not in ("same", None):
        torch.device(output_device)  # a bad device name fails here, before the pass
    args = as_args(input_args)
    kwargs = as_kwargs(input_kwargs)
    check_device(device)
    if device is None:
        _check_meta_model(inventory, args, kwargs)
    decomposed = check_decompose(decompose)
    if device is not None:  # meta copies of the inputs here, of the parameters during the pass
        args, kwargs = inputs_on("meta", args, kwargs)
    seed = random.SystemRandom().randrange(2**32) if random_seed is None else int(random_seed)
    if isinstance(layers_to_save, str) and layers_to_save in ("all", "none") or layers_to_save is None:
        request = parse_request(layers_to_save, ())
    else:  # keys to classify: module and buffer addresses are needed
        module_addresses, buffer_addresses = traced_addresses(model)
        request = parse_request(layers_to_save, module_addresses, buffer_addresses)
    if keep_unsaved_layers is None:
        keep_unsaved_layers = request.save_all or request.saves_nothing

    interventions = check_intervene(intervene) if intervene is not None else None
    stream = (
        _streamed_save(save_to, save_gradients) if save_to is not None else None
    )  # before the pass: bad paths fail now

    # saved bytes against free memory (capture/memory.py); with save_to they go to disk instead
    held = inventory.parameters + inventory.buffers
    memory = MemoryCheck.for_pass(held, args, kwargs, output_device) if stream is None else None
    # the first pass takes the inventory made above (a meta pass swaps the parameters: not that one)
    session = PassSession(first=inventory) if device is None else None

    def plan(**which: Any) -> SavePlan:
        make = SavePlan if stream is None else stream.plan
        made = make(
            output_device=output_device, activation_postfunc=activation_postfunc, detach=detach_saved_tensors, **which
        )
        made.hands_out_output = False  # the history is returned, not the output: nothing can write into it
        return made

    decomposing = decompositions(decomposed)

    def hooks(made: SavePlan, *more: Optional[PassHook]) -> List[PassHook]:
        """The features that join a pass: the memory check where it saves, decompositions, ``more``."""
        return [h for h in (None if made.saves_nothing else memory, decomposing, *more) if h is not None]

    with (
        eager_only(),
        stream or contextlib.nullcontext(),
        MetaCopies(model) if device is not None else contextlib.nullcontext(),
        FastPathOff(bool(decomposed)),  # nn.MultiheadAttention then calls scaled_dot_product_attention
        automatic_collection_paused(),  # the pass's records would be promoted mid-pass (collector.py)
    ):  # compiled submodules run eagerly, so their operations are seen
        if request.needs_labels or interventions:
            # the first pass gets a deep copy of the inputs: the user's objects (a growing KV
            # cache, a tensor the model writes into) must be used once, by the pass they get
            look = plan()
            looked = traced_pass(
                model,
                args,
                kwargs,
                look,
                seed=seed,
                hooks=hooks(look),
                fresh_inputs=True,
                keep_buffers=True,
                session=session,
            )
            if looked.copy_note is not None:
                notes.append(f"layers_to_save needed a first pass to resolve labels: {looked.copy_note}")
            first = looked.history
            del looked
            chosen = frozenset(resolve_request(request, first))
            saving = dict(save_function_args=save_function_args, save_gradients=save_gradients)
            second = (
                plan(raw_indices=chosen, **saving)
                if request.needs_labels
                else plan(
                    save_all=request.save_all,
                    type_substrings=request.type_substrings,
                    modules=request.modules,
                    addresses=request.addresses,
                    **saving,
                )
            )
            # resolved on the first pass, like layers_to_save keys
            replacing = plan_interventions(interventions, first) if interventions else None
            if memory is not None and not second.saves_nothing:  # the bytes it saves are known now
                memory.check_plan(first.layer_list, second)
            traced = traced_pass(model, args, kwargs, second, seed=seed, hooks=hooks(second, replacing))
            result, history = traced.result, traced.history
            if replacing is not None:
                check_applied(replacing, history)
            elif history.layer_labels != first.layer_labels:
                raise RuntimeError(
                    "layers_to_save: the model ran differently in the second pass needed to resolve "
                    "labels and positions (its operations depend on something other than the inputs "
                    "and the random seed). Use layers_to_save='all' or module addresses/substrings."
                )
        else:
            only = plan(
                save_all=request.save_all,
                type_substrings=request.type_substrings,
                modules=request.modules,
                addresses=request.addresses,
                save_function_args=save_function_args,
                save_gradients=save_gradients,
            )
            traced = traced_pass(model, args, kwargs, only, seed=seed, hooks=hooks(only), session=session)
            result, history = traced.result, traced.history
            resolve_request(request, history)  # unknown keys raise, with close matches
    notes += compiled_function_notes(result.records, result.code_ids)  # known once they have run
    if not any(e.kind == "output" for e in reversed(history.layer_list)):  # outputs come last
        notes.append(
            "the forward's return value holds no tensor (it returned None, or values torchlens does not look "
            f"into), so this history has no output layer: nothing marks what the model produced. Its "
            f"{history.num_tensors} tensors are recorded; return the tensor you want to see as the output."
        )
    for note in notes:
        print(f"torchlens: note: {note}", file=sys.stderr)
    history.notes.extend(notes)
    history = history if keep_unsaved_layers else drop_unsaved(history)
    if stream is not None:
        history = stream.finish(history)
    if drawing is not None:
        from .render import GraphvizNotFoundError, render_graph

        try:
            render_graph(history, drawing)
        except GraphvizNotFoundError as error:
            error.history = history  # the trace is not lost: error.history
            raise
    return history


def get_model_metadata(
    model: nn.Module, input_args: Any, input_kwargs: Optional[Dict[str, Any]] = None, random_seed: Optional[int] = None
) -> ModelHistory:
    """Everything ``log_forward_pass`` records except activations (none are saved).

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.get_model_metadata(torch.nn.Linear(4, 3), torch.rand(2, 4))
        >>> h['linear_1_1'].activation is None, h['linear_1_1'].shape
        (True, torch.Size([2, 3]))
    """
    require_model(model, "get_model_metadata")
    return log_forward_pass(model, input_args, input_kwargs, layers_to_save=None, random_seed=random_seed)


def validate_model_activations(
    model: nn.Module,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    random_seed: Optional[int] = None,
    verbose: bool = False,
) -> bool:
    """True if the activations torchlens saves are exactly those of the real forward pass.

    Runs the model twice: plainly on a deep copy of the inputs, then logged on the inputs
    themselves, which therefore end as after one plain forward (a ``DynamicCache`` grows once).
    The model is left as it was found: parameters, buffers and the caller's RNG state. With
    ``verbose=True`` every failed check is printed with the layer and the reason.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Dropout())
        >>> tl.validate_model_activations(model, torch.rand(2, 4), random_seed=0)
        True
    """
    require_model(model, "validate_model_activations")
    check("validate_model_activations", random_seed=random_seed, verbose=verbose)
    seed = random.SystemRandom().randrange(2**32) if random_seed is None else int(random_seed)
    args, kwargs = as_args(input_args), as_kwargs(input_kwargs)
    if is_meta_pass(model, args, kwargs):
        raise refuse_meta("validate_model_activations")
    # paused throughout (collector.py): a collection during the replays would promote the
    # history being checked, and the full collections that promotion triggers walk the whole
    # process (about a fifth of a GPT-2's validation); the history is gone when it resumes
    with automatic_collection_paused():
        return _validated(model, args, kwargs, seed=seed, verbose=verbose)


def _validated(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, seed: int, verbose: bool) -> bool:
    """``validate_model_activations`` once its arguments are checked."""
    rng = RngState()
    buffers = BufferSnapshot(model)
    params: List[Tuple[torch.Tensor, torch.Tensor]] = []
    try:
        if any(is_lazy(p) for p in model.parameters()):
            # lazy modules (nn.LazyLinear) create their parameters first, from the caller's random
            # streams as in a plain forward: the seeded runs below must draw the same numbers
            lazy_args, lazy_kwargs, _ = copy_inputs(model, args, kwargs)
            with torch.no_grad():
                model(*lazy_args, **lazy_kwargs)
            del lazy_args, lazy_kwargs
            buffers.restore()
        params = [(p, p.detach().clone()) for p in model.parameters()]
        plain_args, plain_kwargs, note = copy_inputs(model, args, kwargs)
        if note is not None and verbose:
            print(f"validate_model_activations: note: {note}")
        seed_everything(seed)
        with eager_only():  # as in the logged pass: compiled parts run their Python code
            expected = [t.detach().clone() for _, t in tensors_in(model(*plain_args, **plain_kwargs))]
        del plain_args, plain_kwargs
        buffers.restore()
        history = log_forward_pass(
            model,
            list(args),
            kwargs,
            layers_to_save="all",
            save_function_args=True,
            detach_saved_tensors=True,
            random_seed=seed,
        )
        from .validate import validate_history  # loaded on first use: import torchlens stays light

        return validate_history(history, expected, verbose)
    finally:
        buffers.restore()
        with torch.no_grad():
            for i in unequal(params):  # one wait per device on a GPU, not one per parameter
                params[i][0].copy_(params[i][1])
        rng.restore()
