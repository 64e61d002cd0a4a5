"""A griffe extension for the reference pages: torchlens's docstrings title their doctest section
``Example:`` (singular), which griffe's Google parser reads as a note whose ``>>>`` lines would be
rendered as prose; this renames it ``Examples:`` so the lines render as code."""

import re

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
