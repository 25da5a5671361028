"""The exception every weights reader raises for a file it cannot read."""

from __future__ import annotations

import os

__all__ = ["WeightsFileError"]


class WeightsFileError(ValueError):
    """A weights file that is unreadable, truncated, corrupted or of an unsupported kind.

    ``str(error)`` starts with the file's path and says what is wrong (and where, as a byte
    offset or a tensor name, when that is known). A ``ValueError``, so code that catches MAX's
    ``ValueError`` keeps working.

    Attributes:
        path: the file (or directory) that could not be read.
    """

    def __init__(self, path: str | os.PathLike[str], message: str):
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: {message}")
