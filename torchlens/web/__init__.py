"""The one front end both pages use (the op-level graph page and the explorer): the HTML, CSS
and JavaScript in ``assets/``, their inlining into self-contained files (``embed``), the one
rule for the exact statistics of a tensor (``exact``), and the one rule for histograms of tensor
values with their packing into one host transfer and back (``stats``)."""
