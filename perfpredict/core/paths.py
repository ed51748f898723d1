"""Output paths checked before any work starts, so a bad path fails in a second with one line, not after a
ranking has printed."""

from __future__ import annotations

import os
from pathlib import Path

from perfpredict.core.errors import PerfPredictError


def writable_file(option: str, path: str | Path, *, not_same_as: str | Path | None = None) -> Path:
    p = Path(path)
    if not str(path) or "\0" in str(path):
        raise PerfPredictError(f"{option}: {str(path)!r} is not a usable file name")
    if p.is_dir():
        raise PerfPredictError(f"{option}: {str(p)!r} is a directory; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        _no_file_on_the_way(option, parent)
        raise PerfPredictError(f"{option}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise PerfPredictError(f"{option}: {str(p)!r} is not writable")
    if not_same_as is not None and p.exists() and Path(not_same_as).exists() and p.samefile(not_same_as):
        raise PerfPredictError(f"{option}: {str(p)!r} is the input file; give another output name")
    return p


def writable_dir(option: str, path: str | Path) -> Path:
    """A folder that exists or can be made (its nearest existing ancestor is a writable folder)."""
    p = Path(path)
    if not str(path) or "\0" in str(path):
        raise PerfPredictError(f"{option}: {str(path)!r} is not a usable folder name")
    _no_file_on_the_way(option, p)
    q = _nearest_existing(p)
    if not os.access(q, os.W_OK):
        raise PerfPredictError(f"{option}: {str(q)!r} is not writable")
    return p


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q.parent != q:
        q = q.parent
    return q


def _no_file_on_the_way(option: str, folder: Path) -> None:
    """A regular file where a folder must be (the folder itself or one above it) is the real problem, not a
    missing folder: name it."""
    q = _nearest_existing(folder)
    if q.exists() and not q.is_dir():
        raise PerfPredictError(f"{option}: {str(q)!r} is a file, not a folder")
