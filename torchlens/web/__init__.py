"""The one front end both pages use (the op-level graph page and the explorer): the HTML, CSS
and JavaScript in ``assets/``, their inlining into self-contained files (``embed``), and the one
rule for statistics and histograms of tensor values (``stats``)."""
