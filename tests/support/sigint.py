"""Children that see Ctrl+C (SIGINT) however pytest itself was started.

A shell without job control (a script, ``sh -c '... &'``, CI runners) starts background commands
with SIGINT ignored, and an ignored signal stays ignored through ``fork`` and ``exec``. A Python
child that starts with SIGINT ignored installs no ``KeyboardInterrupt`` handler, so a test that
interrupts it would wait for an exit that never comes. Every child a test sends SIGINT to starts
with ``preexec_fn=default_sigint``: SIGINT at its default between ``fork`` and ``exec``, and so
the child's Python handles it as it does under a terminal.
"""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """``preexec_fn`` for a child that a test will interrupt: SIGINT back at its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
