"""``python -m torchlens.train.serve``: the serving process ``tl.watch`` starts (see ``process.py``)."""

from .process import main

if __name__ == "__main__":  # importing this file (e.g. to list the package) starts nothing
    main()
