"""The live processes of this machine, read from /proc (for the tests' leak checks)."""

from __future__ import annotations

import os


def live_processes() -> dict[int, list[str]]:
    """``pid -> the fields of /proc/<pid>/stat after the command name`` (``[state, ppid, pgrp,
    session, ...]``) of every process that is not a zombie."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] != "Z":
            table[int(entry)] = fields
    return table
