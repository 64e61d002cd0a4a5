"""The trace wing: one forward pass of a model becomes a ``ModelHistory``, and what is done with it.

``capture`` wraps torch for one pass and makes plain records (``records``); ``postprocess`` turns
them into a ``history``; ``render``, ``storage``, ``replay``/``validate``, ``rerun`` and
``intervene`` read or remake histories; ``api`` is the entry point; ``observe`` lets another
wing subscribe to a pass.
"""
