"""Replacing a directory so that a reader always finds a whole one: the old until the new is complete.

The writer puts the new version of ``path`` beside it, at :func:`staging_path` (``<path>.maxjax-new``),
which must appear only once it is complete (orbax writes into a temporary directory and renames it
at the end), and then :func:`swap_in`:

1. ``path`` is renamed to ``<path>.maxjax-old``;
2. ``<path>.maxjax-new`` is renamed to ``path``;
3. ``<path>.maxjax-old`` is deleted.

Renames are atomic on POSIX filesystems (the parent directory is fsynced after each), so a process
killed at any moment leaves ``path`` whole, or, between steps 1 and 2, no ``path`` but the complete
new version at ``<path>.maxjax-new`` (and the old one at ``<path>.maxjax-old``). Readers open
:func:`live_path`; the next writer first calls :func:`recover`, which completes or discards what an
interrupted writer left. One writer at a time.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Callable

__all__ = ["staging_path", "live_path", "recover", "swap_in"]

_NEW = ".maxjax-new"
_OLD = ".maxjax-old"
_ORBAX_TMP = ".orbax-checkpoint-tmp"  # orbax's temporary directories: <final path>.orbax-checkpoint-tmp-<n>


def staging_path(path: str) -> str:
    """Where the writer puts the new version of ``path``."""
    return path + _NEW


def live_path(path: str, complete: Callable[[str], bool]) -> str:
    """The directory a reader of ``path`` should open: ``path`` itself if it exists, else the last
    complete version an interrupted writer left (the new one first), else ``path``. Changes nothing."""
    if os.path.lexists(path):
        return path
    for candidate in (path + _NEW, path + _OLD):
        if complete(candidate):
            return candidate
    return path


def recover(path: str, complete: Callable[[str], bool]) -> None:
    """Finishes what an interrupted writer of ``path`` left: puts the newest complete version back
    at ``path`` if there is none, and deletes the rest (old versions, unfinished temporary ones).

    Raises:
        OSError: a rename or a deletion fails.
    """
    if not os.path.lexists(path):
        for candidate in (path + _NEW, path + _OLD):
            if complete(candidate):
                os.rename(candidate, path)
                _sync_parent(path)
                break
    if os.path.lexists(path):
        _remove(path + _OLD)
    _remove(path + _NEW)
    for leftover in glob.glob(glob.escape(path + _NEW + _ORBAX_TMP) + "*"):
        _remove(leftover)


def swap_in(path: str) -> None:
    """Replaces ``path`` (if any) by the complete :func:`staging_path` (steps 1-3 of the module doc).

    Raises:
        OSError: a rename or a deletion fails (``path`` or ``<path>.maxjax-new`` is then whole, as
            :func:`live_path` finds it).
    """
    new, old = path + _NEW, path + _OLD
    if os.path.lexists(path):
        _remove(old)
        os.rename(path, old)
        _sync_parent(path)
        os.rename(new, path)
        _sync_parent(path)
        _remove(old)
    else:
        os.rename(new, path)
        _sync_parent(path)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _sync_parent(path: str) -> None:
    """Makes the renames in ``path``'s directory durable (where the filesystem supports it)."""
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
