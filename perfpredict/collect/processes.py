"""The collectors' child processes: workers started by module path with this checkout's perfpredict first on
their PYTHONPATH, and a launch's whole process tree stopped when it times out or fails."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

# The folder holding the perfpredict package: workers are started by module name from another cwd (and maybe
# another interpreter), so this is put first on their PYTHONPATH to make them import this copy of the code.
PKG_ROOT = str(Path(__file__).resolve().parents[2])


def pythonpath_first(current: str | None) -> str:
    """PYTHONPATH for a worker: PKG_ROOT, then the inherited entries (if any)."""
    return PKG_ROOT + (os.pathsep + current if current else "")


def _descendants(pid: int) -> list[int]:
    """Every process below pid. torchrun starts its workers in sessions of their own, so killing torchrun's
    process group does not reach them: they are found by parentage (psutil, else /proc) before anything dies."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - the process is already gone
        return []
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_group(proc: subprocess.Popen) -> None:
    """Stop torchrun and every rank: SIGTERM first (torchrun forwards it and cleans up), then SIGKILL to whatever
    is left of the tree."""
    if proc.poll() is not None and not _descendants(proc.pid):
        return
    tree = _descendants(proc.pid)
    for sig, pids in ((signal.SIGTERM, [proc.pid]), (signal.SIGKILL, [proc.pid, *tree])):
        for pid in pids:
            try:
                os.killpg(pid, sig) if pid == proc.pid else os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
