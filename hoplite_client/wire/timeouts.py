"""What a caller's ``timeout`` means: the one rule the client and the daemon both apply.

A timeout is in seconds. ``None`` and ``+inf`` wait forever (normalised to ``None``, which is
what the wire and the event loop understand); ``0`` polls once: the answer is what is there
now, or a timeout error at once; a finite positive number waits that long. A negative number,
``-inf`` and NaN are refused, and so is anything that is not a real number (``True`` included),
because an event loop cannot schedule them: NaN would raise inside the daemon (see
``test_dispatcher_answers_invalid_and_never_calls_the_handler`` in tests/unit/test_limits.py).
"""

from __future__ import annotations

import math
from numbers import Real

from hoplite_client.wire.errors import InvalidArgumentError


def check_timeout(value: object, what: str = "timeout") -> float | None:
    """``value`` as a timeout: None (wait forever) or finite seconds >= 0; else
    InvalidArgumentError naming ``what``."""
    if value is None:
        return None
    if type(value) is float:  # the usual case, without the costlier check against Real
        seconds = value
    elif isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidArgumentError(f"{what} must be a number of seconds or None, "
                                   f"not {type(value).__name__}")
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float: its sign still says which end
            seconds = -math.inf if value < 0 else math.inf
    if math.isnan(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{what} must be >= 0 seconds (None or inf: wait forever), "
                                   f"not {seconds}")
    return None if math.isinf(seconds) else abs(seconds)  # abs: -0.0 is plain 0
