"""Whether a process lives: the one question that the fork server's clean-up, the read-ahead's
folders and the batch cache's temporary files all ask of a pid named in a file.

A leaf: it imports nothing of hydrax, so any module may use it.
"""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts as alive, a zombie does not):
    what decides if a file named after the process that writes it is a dead process's leftover."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # exited, not yet reaped
    except (OSError, IndexError):
        return True
