"""Runnable examples, kept in the repository and not installed with torchlens: the demo
(``make demo``, or ``python -m examples.demo`` from the repository's root) and the scripts that
draw the README's and the documentation's pictures (``make images``; some launch Chromium).
``browser.py`` finds and launches that Chromium, for the picture scripts, the browser tests and
the page benchmarks.
"""
