"""How a collective cuts an object: into equal stripes whose bounds fall on pages.

Shared by the striped allreduce (a stripe per input), the ring (a chunk per member) and two
trees of halves, so each piece's pulls and combines stay page- and element-aligned.
"""

from __future__ import annotations

import math

# Stripe bounds fall on pages, so each stripe's pulls and combines stay page-aligned.
ALIGN = 4096


def stripe_bounds(size: int, itemsize: int, m: int) -> list[tuple[int, int]]:
    """``m`` stripes of ``size`` bytes, as equal as whole aligned blocks allow, in order."""
    align = math.lcm(itemsize, ALIGN)
    blocks = -(-size // align)
    cuts = [min(size, (blocks * i // m) * align) for i in range(m + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(m)]
