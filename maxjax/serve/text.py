"""Streaming output text with stop strings cut as OpenAI cuts them.

:class:`StopStrings` takes text pieces as the detokenizer makes them and returns what may be shown:
text that could still be the start of a stop string is held back until the next pieces decide, and
the first stop string found ends the text just before it (the stop string is not included, nor
anything after it).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["StopStrings"]


class StopStrings:
    """Cuts a stream of text pieces at the first of ``stop`` strings.

    ``add(piece)`` returns ``(text, stopped)``: the text that can be shown now and whether a stop
    string was found (then nothing more may be added). ``flush()`` returns what was held back (at
    the end of generation for another reason). The texts joined are the whole text up to, and not
    including, the earliest stop string.
    """

    def __init__(self, stop: Sequence[str]):
        self.stop = tuple(s for s in stop if s)
        self._text = ""  # everything added
        self._shown = 0  # how much of it was returned
        self.stopped = False

    def _held(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self._text)), best, -1):
                if self._text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _pending(self, before: int) -> int | None:
        """The first position ``p < before`` from which the text is a proper prefix of a stop string
        (a stop string there would end the text earlier than a hit at ``before``), or None."""
        for p in range(max(self._shown, len(self._text) - max(len(s) for s in self.stop) + 1), before):
            tail = self._text[p:]
            if any(len(tail) < len(s) and s.startswith(tail) for s in self.stop):
                return p
        return None

    def _first_hit(self) -> int | None:
        hits = [i for i in (self._text.find(s, self._shown) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def add(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            raise RuntimeError("a stop string has already ended this text")
        if not piece:
            return "", False
        self._text += piece
        if not self.stop:
            out, self._shown = self._text[self._shown :], len(self._text)
            return out, False
        end = self._first_hit()
        if end is not None:
            pending = self._pending(end)
            if pending is None:  # no longer stop string can still start before this one
                out = self._text[self._shown : end]
                self._text, self._shown, self.stopped = self._text[:end], end, True
                return out, True
            end = pending
        else:
            end = len(self._text) - self._held()
        out = self._text[self._shown : end] if end > self._shown else ""
        self._shown = max(self._shown, end)
        return out, False

    def flush(self) -> str:
        """The held-back text, at the end of generation: up to the first stop string in it (then
        :attr:`stopped` is set), or all of it."""
        end = self._first_hit() if self.stop and not self.stopped else None
        if end is not None:
            self._text, self.stopped = self._text[:end], True
        out, self._shown = self._text[self._shown :], len(self._text)
        return out

    @property
    def text(self) -> str:
        """The text so far (cut at the stop string once one was found)."""
        return self._text
