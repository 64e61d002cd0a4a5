"""The graph page of a ``GenerateHistory``: one step's structure (nodes, module boxes, edges:
the usual graph page) drawn once, with a step slider. The page holds, per step, the shape,
dtype, size and statistics of each node's tensor (matched by label); moving the slider puts
that step's onto the same nodes (``web/assets/graph_steps.js``). A step whose structure differs
(the prefill of some models) shows the nodes it shares by label; the others show no shape or
values there. (The history is taken as any object with ``steps``, ``tokens``, ``prompt_length`` and
``model_name``: result.py imports this file, not the reverse.)"""

from __future__ import annotations

import html as _html
import os
from typing import Any, Dict, List, Optional

from ...web.embed import inline_page, inline_script, read_asset
from ...web.stats import tensor_stats
from ..render import page_data


def _step_values(history: Any, labels: List[str]) -> List[Optional[List[Any]]]:
    """Per node of the drawn structure: [shape, dtype, nbytes, stats] at this step, or None."""
    by_label = {e.label: e for e in history.layer_list}
    out: List[Optional[List[Any]]] = []
    for label in labels:
        e = by_label.get(label)
        if e is None:
            out.append(None)
            continue
        dtype = str(e.dtype).replace("torch.", "") if e.dtype is not None else None
        shape = list(e.shape) if e.shape is not None else None
        out.append([shape, dtype, e.nbytes, tensor_stats(e.activation)])
    return out


def steps_data(gen: Any, structure_step: Optional[int] = None) -> Dict[str, Any]:
    """``page_data`` of the structure step, plus ``steps``: its name, token and values per step.

    Example:
        >>> import torch, transformers, torchlens as tl
        >>> model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2,
        ...                                                              vocab_size=50)).eval()
        >>> gen = tl.log_generate(model, torch.tensor([[1, 2]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
        >>> data = steps_data(gen)
        >>> [s["name"] for s in data["steps"]], data["step"]
        (['prefill', 'decode 1', 'decode 2'], 1)
    """
    if not gen.steps:
        raise ValueError("This generation has no steps to draw.")
    if structure_step is None:
        structure_step = 1 if len(gen.steps) > 1 else 0
    structure = gen[structure_step]
    data = page_data(structure)
    labels = [op["label"] for op in data["ops"]]
    tokens = gen.tokens[0].tolist() if gen.tokens.dim() == 2 else []
    steps = []
    for i, history in enumerate(gen.steps):
        position = gen.prompt_length + i
        steps.append(
            {
                "name": "prefill" if i == 0 else f"decode {i}",
                "token": tokens[position] if position < len(tokens) else None,
                "ops": _step_values(history, labels),
            }
        )
    data["steps"] = steps
    data["step"] = structure_step if structure_step >= 0 else len(gen.steps) + structure_step
    return data


def steps_page(gen: Any, path: Optional[str] = None, structure_step: Optional[int] = None) -> str:
    """The page as HTML text (see the module doc); with ``path`` also written there."""
    page = inline_page("graph.html", steps_data(gen, structure_step), "TORCHLENS_GRAPH")
    page = page.replace(
        "<title>torchlens graph</title>",
        f"<title>{_html.escape(gen.model_name)} · generate · torchlens graph</title>",
    )
    script = f"<script>\n{inline_script(read_asset('graph_steps.js'))}</script>\n</body>"
    page = page.replace("</body>", script, 1)
    if path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    return page


__all__ = ["steps_page", "steps_data"]
