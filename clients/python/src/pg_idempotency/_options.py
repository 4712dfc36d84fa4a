"""Options as the client takes them, checked when given rather than in
every call that uses them."""

import math


def seconds(name, value, default, *, positive=False):
    """A duration option in seconds: None keeps ``default``; anything but a
    finite number from 0 (above 0 when ``positive``) is refused, saying so,
    where it would otherwise fail later (a heartbeat thread, every request)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        kind = "above 0" if positive else "from 0"
        raise ValueError(f"{name} must be a finite number of seconds {kind}, not {value!r}")
    return value
