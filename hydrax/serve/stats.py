"""Running message statistics, as tensorcom's ``Statistics`` has them (with a working ``summary``)."""

from __future__ import annotations

import collections
import time


class Statistics:
    """Counts, totals and rates of messages (``add(nbytes)`` once per message).

    tensorcom 0.1.0's class of the same name raises ``NameError`` in ``summary()`` and so in every
    report; this one keeps its methods and words.

    :param horizon: how many recent messages :meth:`recent_rate` and :meth:`recent_throughput` use.
    """

    def __init__(self, horizon: int = 1000) -> None:
        self.horizon = horizon
        self.reset()

    def reset(self) -> None:
        """Start counting again."""
        self.start = self.last = time.time()
        self.count = 0
        self.total = 0
        self.recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=self.horizon)

    def add(self, x: int) -> None:
        """Count one message of ``x`` bytes."""
        self.last = time.time()
        self.count += 1
        self.total += x
        self.recent.append((self.last, x))

    def rate(self) -> float:
        """Messages per second since the start."""
        elapsed = self.last - self.start
        return self.count / elapsed if self.count and elapsed > 0 else 0.0

    def throughput(self) -> float:
        """Bytes per second since the start."""
        elapsed = self.last - self.start
        return self.total / elapsed if self.count and elapsed > 0 else 0.0

    def recent_rate(self) -> float:
        """Messages per second over the last ``horizon`` messages."""
        if len(self.recent) < 2:
            return 0.0
        elapsed = self.recent[-1][0] - self.recent[0][0]
        return (len(self.recent) - 1) / elapsed if elapsed > 0 else 0.0

    def recent_throughput(self) -> float:
        """Bytes per second over the last ``horizon`` messages."""
        if len(self.recent) < 2:
            return 0.0
        elapsed = self.recent[-1][0] - self.recent[0][0]
        return sum(n for _, n in list(self.recent)[1:]) / elapsed if elapsed > 0 else 0.0

    def summary(self) -> str:
        """``"rate 12.000000 msg/s throughput 1.20e+08 bytes/s"``, tensorcom's words."""
        return f"rate {self.recent_rate():f} msg/s throughput {self.recent_throughput():.2e} bytes/s"
