"""The record types every stage shares, at the bottom of the package: ``TensorLogEntry`` (one
tensor of a pass), ``ParentRef``, ``FuncCallLocation`` (a frame of a call stack), ``Position``
(where a tensor sat in a call's arguments or outputs), ``EntryRow`` (an entry as a table row)
and the formatting helpers they print with. Capture fills them, post-processing completes them,
the history holds them; this package imports nothing else from torchlens."""
