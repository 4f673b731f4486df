"""What backing an extent costs when its pages are backed already: ``Arena.populate`` alone
on the loop, averaged over many calls (docs/benchmarks.md, "Warm extents skip the populate
thread").

Usage: python bench/warm_populate.py --sizes 1,64,256
"""

from __future__ import annotations

import argparse
import time

import uvloop

from hoplited.memory.arena import Arena

MiB = 1 << 20


async def per_call(size: int) -> tuple[float, float]:
    """Wall and CPU seconds of one populate of a warm extent of ``size`` bytes."""
    arena = Arena(size + MiB)
    try:
        offset = arena.alloc(size)
        await arena.populate(offset, size)  # backs it: every call below finds it warm
        calls = max(20, 2000 * MiB // size)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await arena.populate(offset, size)
        return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls
    finally:
        arena.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64,256", help="comma-separated extents in MiB")
    args = parser.parse_args()
    print("| extent | wall per populate | CPU per populate |")
    print("| --- | --- | --- |")
    for mib in (int(s) for s in args.sizes.split(",")):
        wall, cpu = uvloop.run(per_call(mib * MiB))
        print(f"| {mib} MiB | {wall * 1e6:.1f} µs | {cpu * 1e6:.1f} µs |", flush=True)


if __name__ == "__main__":
    main()
