"""The call stack of a logged call: the frames between the model's entry (``run_model``) and
the call, as ``(code, line, bytecode offset)`` records, outermost first.

torchlens's own frames (the wrappers, which share one code object, ``on_call``, the opaque
wrappers, the tensor classes' call hook) and torch's module-call machinery are left out; the
walk stops at ``run_model``'s frame, so the user's script is never part of a stack. Codes are
known by id (hashing a code object hashes its bytecode and constants, at every frame); a line
is a function of the code and the offset, so each is read once per pass (``f_lineno`` decodes
the line table at every read) and its record shared by later calls.

Example:
    >>> import sys
    >>> def outer():
    ...     return inner()
    >>> def inner():
    ...     return StackWalker(stop_code=None, skip_code_ids=frozenset()).walk(sys._getframe())
    >>> [code.co_name for code, line, offset in outer()][-2:]
    ['outer', 'inner']
"""

from __future__ import annotations

import inspect
import types
from typing import Dict, FrozenSet, List, Optional, Tuple

from torch import nn

Site = Tuple[types.CodeType, int, int]  # (code, line, bytecode offset): one call site's record
Sites = Dict[int, Site]  # a code's call sites seen so far, by bytecode offset

# Frames of torch's module-call machinery are not part of any func_call_stack.
_MODULE_CALL_FILE = nn.Module._call_impl.__code__.co_filename
# a frame of these codes can be resumed from different callers: its f_back is not fixed
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# what a walk finds for a code (``StackWalker.sites``), besides its call sites: a code never part
# of a stack (a wrapper, torch's module call), walked past, or the same but resumable (its frame
# is listed, see ``walk``); and the stop. Never written.
_PASS: Sites = {}
_SKIPPED: Sites = {}
_STOP: Sites = {}


class StackWalker:
    """Walks frames up to ``stop_code``'s, skipping the codes whose ids are in ``skip_code_ids``;
    one per pass (its caches hold the codes they know, so no id is reused while it lives)."""

    def __init__(self, stop_code: Optional[types.CodeType], skip_code_ids: FrozenSet[int]) -> None:
        self.stop_code = stop_code
        self.skip_code_ids = skip_code_ids
        # id(code) -> its call sites, or a marker above: one lookup per frame of a walk; the codes
        # themselves are held, so that no id is reused while the walker lives
        self.sites: Dict[int, Sites] = {}
        self.codes: List[types.CodeType] = []
        # the last walk's first frame and the records above it: consecutive calls from one frame
        # (a forward making op after op) share their callers, so only the first record changes
        self.last_frame: Optional[types.FrameType] = None
        self.last_outer: Tuple[Site, ...] = ()
        self.last_sites: Sites = {}  # the sites of last_frame's code
        # the frames of the last walk, outermost first (held: a frame met again is this one,
        # not a new one at its address), and per frame id: (its place in that list, its bytecode
        # offset then, how many records of ``chain_records`` lie at or above it). A frame met
        # again at the same offset is still inside the same call, and so are all its callers
        # (none can move on while it runs): its records and theirs are taken from there. Only
        # frames with no resumable frame above them, and none of a skipped code (a walk passes
        # those on to the next frame listed: cheaper than listing three frames of torch's module
        # call per module); ids of frames no longer listed are stale (their place holds another
        # frame, or none).
        self.chain_frames: List[types.FrameType] = []
        self.chain: Dict[int, Tuple[int, int, int]] = {}
        self.chain_records: Tuple[Site, ...] = ()

    def sites_of(self, code: types.CodeType) -> Sites:
        """``code``'s call sites seen so far, or a marker: ``_PASS`` or ``_SKIPPED`` for a code
        never part of a stack (``_SKIPPED``: resumable), ``_STOP`` for the stop."""
        sites = self.sites.get(id(code))
        if sites is None:
            if code is self.stop_code:
                sites = _STOP
            elif id(code) not in self.skip_code_ids and code.co_filename != _MODULE_CALL_FILE:
                sites = {}
            else:
                sites = _SKIPPED if code.co_flags & _RESUMABLE else _PASS
            self.sites[id(code)] = sites
            self.codes.append(code)  # held: its id cannot be reused during the pass
        return sites

    def walk(self, frame: types.FrameType) -> Tuple[Site, ...]:
        """The records of ``frame`` and its callers up to the stop, outermost first."""
        if frame is self.last_frame:  # still running (held here, so not a new frame at its address)
            lasti = frame.f_lasti  # its own sites, known since the walk that set last_frame: _site inlined
            site = self.last_sites.get(lasti)
            if site is None:
                site = self.last_sites[lasti] = (frame.f_code, frame.f_lineno, lasti)
            return self.last_outer + (site,)
        at: Optional[types.FrameType] = frame
        found: List[Site] = []
        new: List[Tuple[types.FrameType, int, int]] = []  # (frame, offset, records found below it)
        resumable = -1  # position in ``new`` of the outermost resumable frame
        above: Tuple[Site, ...] = ()  # the records taken from a known frame and its callers
        place = -1  # that frame's place in ``chain_frames``
        known_sites, chain, listed = self.sites, self.chain, self.chain_frames
        while at is not None:
            sites = known_sites.get(id(at.f_code))
            if sites is None:
                sites = self.sites_of(at.f_code)
            if sites is _PASS:
                at = at.f_back  # torch's module call, a wrapper: no record, never listed as a stop
                continue
            if sites is _STOP:
                break
            lasti = at.f_lasti
            held = chain.get(id(at))
            if held is not None and held[1] == lasti and held[0] < len(listed) and listed[held[0]] is at:
                place = held[0]
                above = self.chain_records[: held[2]]
                break
            code = at.f_code
            if code.co_flags & _RESUMABLE:
                resumable = len(new)
            new.append((at, lasti, len(found)))
            if sites is not _SKIPPED:
                site = sites.get(lasti)
                if site is None:
                    site = sites[lasti] = (code, at.f_lineno, lasti)
                found.append(site)
            at = at.f_back
        found.reverse()
        records = above + tuple(found)
        self._remember(new[resumable + 1 :], records, place)
        if resumable < 0 and found and found[-1][0] is frame.f_code:
            self.last_frame, self.last_outer, self.last_sites = frame, records[:-1], self.sites[id(frame.f_code)]
        return records

    def innermost(self, frame: Optional[types.FrameType]) -> Optional[types.FrameType]:
        """The frame of the last record ``walk(frame)`` would give (None if it gives none)."""
        known_sites = self.sites
        while frame is not None:
            sites = known_sites.get(id(frame.f_code))
            if sites is None:
                sites = self.sites_of(frame.f_code)
            if sites is _STOP:
                return None
            if sites is not _PASS and sites is not _SKIPPED:
                return frame
            frame = frame.f_back
        return None

    def _remember(self, new: List[Tuple[types.FrameType, int, int]], records: Tuple[Site, ...], place: int) -> None:
        """The chain for the next walks: the known frames at and above ``place`` (where this
        walk stopped), then this walk's frames (``new``, innermost first: (frame, offset,
        records below it); only those with no resumable frame above)."""
        listed = self.chain_frames[: place + 1]
        chain, total = self.chain, len(records)
        for at, lasti, below in reversed(new):
            chain[id(at)] = (len(listed), lasti, total - below)
            listed.append(at)
        self.chain_frames, self.chain_records = listed, records

    def forget(self) -> None:
        """Let go of the frames held (a finished one keeps its locals alive while held)."""
        self.last_frame, self.last_outer, self.last_sites = None, (), {}
        self.chain_frames, self.chain, self.chain_records = [], {}, ()

    def count(self, frame: Optional[types.FrameType]) -> int:
        """``len(self.walk(frame))``, without building the records."""
        count = 0
        known_sites, chain, listed = self.sites, self.chain, self.chain_frames
        while frame is not None:
            sites = known_sites.get(id(frame.f_code))
            if sites is None:
                sites = self.sites_of(frame.f_code)
            if sites is _PASS or sites is _SKIPPED:
                frame = frame.f_back  # never listed (see walk)
                continue
            if sites is _STOP:
                break
            held = chain.get(id(frame))
            if held is not None and held[1] == frame.f_lasti and held[0] < len(listed) and listed[held[0]] is frame:
                return count + held[2]  # a known frame still in the same call (see walk)
            count += 1
            frame = frame.f_back
        return count


__all__ = ["StackWalker"]
