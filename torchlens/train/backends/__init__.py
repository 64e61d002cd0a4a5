"""Where a watch's histograms go besides the run database: Weights & Biases and TensorBoard
(``loggers``), the module graph as a TensorBoard graph (``tensorboard_graph``), and the explorer
inline in a Jupyter notebook (``notebook``).

Example:
    >>> from torchlens.train.backends import tag
    >>> tag(("fc:1", "io", "out"))
    'torchlens/fc:1/io/out'
"""

from .loggers import TensorboardBackend, WandbBackend, tag
from .notebook import LiveFeed, mimebundle, show
from .tensorboard_graph import graph_def

__all__ = ["WandbBackend", "TensorboardBackend", "tag", "graph_def", "LiveFeed", "mimebundle", "show"]
