"""Collection of the package's docstring examples: optional integrations are skipped when
their framework is not installed."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("lightning") is None and importlib.util.find_spec("pytorch_lightning") is None:
    collect_ignore.append("torchlens/integrations/lightning.py")
