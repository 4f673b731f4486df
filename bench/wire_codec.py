"""Cost of a message header's encode and checked decode, over every message kind.

Every frame's header is encoded from a record and decoded back into one, each field checked
against the record's annotations (docs/design.md §2.1): work on the path of every small put,
get and locate. Prints the best of several rounds, per message, averaged over the kinds.

Usage: python -m bench.wire_codec --rounds 7 --count 1000
"""

from __future__ import annotations

import argparse
import time

import hoplited.node  # noqa: F401  (registers the daemon's message kinds)
from hoplite_client.wire.messages import MESSAGES
from hoplite_client.wire.schema import from_wire, to_wire
from tests.unit.test_wire import build  # a valid record of each kind, from its annotations


def measure(rounds: int, count: int) -> tuple[int, float, float]:
    """(kinds, decode seconds, encode seconds) per message, best of ``rounds``."""
    records = [build(cls) for cls in MESSAGES.values()]
    raws = [(type(r), to_wire(r)) for r in records]
    decode = encode = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(count):
            for cls, raw in raws:
                from_wire(cls, raw)
        t1 = time.perf_counter()
        for _ in range(count):
            for r in records:
                to_wire(r)
        t2 = time.perf_counter()
        decode = min(decode, (t1 - t0) / (count * len(raws)))
        encode = min(encode, (t2 - t1) / (count * len(records)))
    return len(records), decode, encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    kinds, decode, encode = measure(args.rounds, args.count)
    print(f"{kinds} message kinds: decode {decode * 1e6:.2f} us, encode {encode * 1e6:.2f} us "
          f"per message (best of {args.rounds} rounds of {args.count})")


if __name__ == "__main__":
    main()
