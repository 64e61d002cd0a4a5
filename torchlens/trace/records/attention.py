"""The mark of decomposed attention: ``log_forward_pass(decompose=("sdpa",))`` gives the
attention probabilities of each fused attention call this layer type (capture/decompose.py
writes it, ``history.attention`` and the graph page read it)."""

ATTENTION_TYPE = "attnsoftmax"

__all__ = ["ATTENTION_TYPE"]
