"""What the throttling helpers (`doorman.http`, `doorman.grpc`) share about an answer: the
latency target they are given, checked once, and whether an answer came past it."""

from __future__ import annotations

import math
import time
from typing import Optional


def check_latency_target(latency_target: Optional[float]) -> Optional[float]:
    """`latency_target` itself when it is None or a finite number of seconds above 0 (a bool is
    not a number here); otherwise ValueError naming the argument."""
    if latency_target is not None and not (isinstance(latency_target, (int, float)) and
                                           not isinstance(latency_target, bool) and
                                           0 < latency_target < math.inf):
        raise ValueError("latency_target: must be a number of seconds above 0, or None")
    return latency_target


def past_target(latency_target: Optional[float], sent: Optional[float]) -> bool:
    """Whether an answer to a call sent at `sent` (time.monotonic) came past the target."""
    return latency_target is not None and sent is not None and (
        time.monotonic() - sent > latency_target)
