"""Trace the links of an emulated run: every daemon's interface byte counters, read every few
milliseconds by a separate process, set against the bench's put times.

For each measured run it prints how much each node had sent and received (in objects, S)
when the last input was put, how much it sent in all, how much of that TCP sent again
(segments a link's queue dropped), and how full its uplink ran from the last put to the end:
what a schedule still owes after the last put, and how well the links carry it
(docs/design.md §4, "Why 1.50–1.76 emulated, not 1.30"). Needs root, as `--emulate` does.

Usage: python -m bench.link_trace allreduce --nodes 8 --size 32MiB --arrival-interval 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import uvloop

from hoplite_client.wire.units import parse_size
from hoplited.tools.scenarios import SCENARIOS, BenchContext, Progress, bench_clients
from hoplited.tools.testbed import DEFAULT_MTU, parse_rate

PERIOD = 0.003  # seconds between two readings of every node's counters
# A run's counters start a little before its first put (nothing crosses a link before
# it) and end a reading after its last node has its result: never a neighbour's bytes.
BEFORE = 0.002


@dataclass(frozen=True)
class Sample:
    """Every node's received and sent bytes, and TCP segments sent again, at wall-clock time
    ``t``."""

    t: float
    rx: tuple[int, ...]
    tx: tuple[int, ...]
    resent: tuple[int, ...]


@dataclass(frozen=True)
class RunTrace:
    """One run's links, in objects (S): per node, what it had sent and received at the last
    put, what it sent in all, and the part of its uplink's rate it used after the last put."""

    elapsed: float
    puts: tuple[float, ...]  # seconds after the first put
    tx_at_last: tuple[float, ...]
    rx_at_last: tuple[float, ...]
    tx_total: tuple[float, ...]
    rx_total: tuple[float, ...]
    uplink_use: tuple[float, ...]
    resent_total: tuple[float, ...]  # at most: each segment sent again counted as a full one


def _counters(text: bytes) -> tuple[int, int]:
    """(received, sent) bytes of the test bed's interface in a /proc/PID/net/dev text."""
    for line in text.split(b"\n"):
        if b"hpl-" in line:
            fields = line.split(b":", 1)[1].split()
            return int(fields[0]), int(fields[8])
    raise RuntimeError("no test bed interface in the daemon's network namespace")


def _resent(text: bytes) -> int:
    """TCP segments sent again, in a /proc/PID/net/snmp text (its network namespace's)."""
    header, values = (line.split() for line in text.split(b"\n") if line.startswith(b"Tcp:"))
    return int(values[header.index(b"RetransSegs")])


def _sample(pids: Sequence[int], stop: Connection) -> None:
    """Read every pid's counters every PERIOD until ``stop`` has a message, saying "ready"
    once the first are read; send back the samples as lists."""
    samples: list[tuple[float, list[int], list[int], list[int]]] = []
    with contextlib.ExitStack() as stack:
        devs = [stack.enter_context(open(f"/proc/{pid}/net/dev", "rb")) for pid in pids]
        snmps = [stack.enter_context(open(f"/proc/{pid}/net/snmp", "rb")) for pid in pids]
        while not stop.poll():
            t = time.time()
            rx, tx, resent = [], [], []
            for dev, snmp in zip(devs, snmps):
                dev.seek(0)
                snmp.seek(0)
                r, s = _counters(dev.read())
                rx.append(r)
                tx.append(s)
                resent.append(_resent(snmp.read()))
            samples.append((t, rx, tx, resent))
            if len(samples) == 1:
                stop.send("ready")
            time.sleep(PERIOD)
    stop.send(samples)


def summarise(samples: Sequence[Sample], puts: Sequence[float], elapsed: float, size: int,
              rate_bps: int, mtu: int = DEFAULT_MTU) -> RunTrace:
    """A run's trace from the samples around it: ``puts`` are its put times (wall clock) and
    ``elapsed`` its latency, counted from the last put; segments on links of ``mtu``."""
    times = [s.t for s in samples]

    def at(t: float) -> Sample:
        return samples[min(bisect.bisect_left(times, t), len(samples) - 1)]

    first, last = min(puts), max(puts)
    base, then, end = at(first - BEFORE), at(last), at(last + elapsed + PERIOD)

    def share(before: tuple[int, ...], now: tuple[int, ...]) -> tuple[float, ...]:
        return tuple((b - a) / size for a, b in zip(before, now))

    tx_total, tx_last = share(base.tx, end.tx), share(base.tx, then.tx)
    per_second = rate_bps / 8
    use = tuple((total - last) * size / (elapsed * per_second)
                for total, last in zip(tx_total, tx_last))
    segment = mtu - 40  # IPv4 and TCP headers
    resent = tuple((b - a) * segment / size for a, b in zip(base.resent, end.resent))
    return RunTrace(elapsed, tuple(p - first for p in sorted(puts)), tx_last,
                    share(base.rx, then.rx), tx_total, share(base.rx, end.rx), use, resent)


def _row(label: str, values: Sequence[float]) -> str:
    return f"  {label:<24}" + " ".join(f"{v:5.2f}" for v in values)


def report(trace: RunTrace, label: str, s_over_rate: float) -> str:
    """The run's lines: its latency, its puts, then one row per measure, a column per node."""
    puts = " ".join(f"{p * 1e3:.0f}" for p in trace.puts)
    return "\n".join([
        f"{label}: {trace.elapsed * 1e3:.1f} ms, {trace.elapsed / s_over_rate:.2f}x S/RATE; "
        f"puts at {puts} ms",
        _row("sent at the last put", trace.tx_at_last),
        _row("received at the last put", trace.rx_at_last),
        _row("sent in all", trace.tx_total),
        _row("received in all", trace.rx_total),
        _row("sent again, at most", trace.resent_total),
        _row("uplink use after it", trace.uplink_use)])


async def trace(op: str, nodes: int, size: int, rate_bps: int, interval: float, repeat: int,
                warmup: int, daemon_args: Sequence[str], mtu: int = DEFAULT_MTU) -> list[RunTrace]:
    """Run ``op`` on an emulated cluster (links of ``mtu``) with its links sampled; one trace
    per measured run."""
    async with bench_clients(nodes, None, None, "2GiB", rate_bps, None,
                             daemon_args, mtu) as (clients, cluster):
        assert cluster is not None
        ctx = BenchContext(clients, size, interval, Progress())
        for i in range(warmup):
            await SCENARIOS[op](ctx, i)
        here, there = multiprocessing.get_context("spawn").Pipe()
        sampler = multiprocessing.get_context("spawn").Process(
            target=_sample, args=([n.pid for n in cluster.nodes], there), daemon=True)
        sampler.start()
        runs: list[tuple[list[float], float]] = []
        try:
            # the runs start once the sampler holds a sample from before them
            ready = await asyncio.to_thread(here.recv)
            assert ready == "ready", ready
            for i in range(repeat):
                before = len(ctx.put_times)
                elapsed = await SCENARIOS[op](ctx, warmup + i)
                runs.append((ctx.put_times[before:], elapsed))
            await asyncio.sleep(0.2)
        finally:
            here.send(None)
            raw = await asyncio.to_thread(here.recv)
            sampler.join(5)
    samples = [Sample(t, tuple(rx), tuple(tx), tuple(resent)) for t, rx, tx, resent in raw]
    return [summarise(samples, puts, elapsed, size, rate_bps, mtu) for puts, elapsed in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("op", choices=["broadcast", "reduce", "allreduce", "gather"])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size", default="32MiB")
    parser.add_argument("--rate", default="1Gbit")
    parser.add_argument("--arrival-interval", type=float, default=0.0)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-pair", action="store_true", help="the daemons' --no-pair")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU,
                        help="the test bed's links (docs/design.md §7: 65000 by default)")
    parser.add_argument("--json", default=None, help="also write the traces to this file")
    args = parser.parse_args()
    size, rate = parse_size(args.size), parse_rate(args.rate)
    traces = uvloop.run(trace(args.op, args.nodes, size, rate, args.arrival_interval,
                              args.repeat, args.warmup, ["--no-pair"] if args.no_pair else [],
                              args.mtu))
    s_over_rate = size * 8 / rate
    for i, t in enumerate(traces):
        print(report(t, f"run {i + 1}/{len(traces)}", s_over_rate))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([t.__dict__ for t in traces], f, indent=1)


if __name__ == "__main__":
    main()
