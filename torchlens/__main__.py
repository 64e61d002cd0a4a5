"""``python -m torchlens``: see ``torchlens.cli``."""

import sys

from .cli import main

sys.exit(main())
