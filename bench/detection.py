"""How soon every member learns that one member froze or died, with watchers or a full mesh.

Starts a local cluster of N daemons on loopback, lets it settle, then SIGSTOPs (or SIGKILLs)
the last one and asks every other daemon for its status (``Stats`` over a tool connection)
every 0.1 s until each lists the victim as dead. Prints, from the signal on, when the
survivors first listed it suspected and dead: the watchers' own verdicts and the others',
which above ``--watchers`` + 1 members come from alarms (docs/design.md §5, "Watchers").

Usage: python bench/detection.py --nodes 40 --watchers 1024,16 --signal STOP
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import time

import uvloop

from hoplite_client.net.channel import Channel
from hoplite_client.net.endpoints import parse_address
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.messages import Stats
from hoplited.cluster.watching import watchers_of
from hoplited.tools.local_cluster import LocalCluster

SETTLE = 5.0  # seconds after start-up: joins, first Pings
POLL = 0.1
GIVE_UP = 60.0


async def detect(nodes: int, watchers: int, sig: signal.Signals
                 ) -> tuple[dict[str, float | None], dict[str, float | None], set[str]]:
    """Seconds from the signal until each survivor listed the victim suspected, and dead (None:
    never within GIVE_UP); and the victim's watchers."""
    args = ["--watchers", str(watchers), "--heartbeat-interval", "0.5",
            "--heartbeat-timeout", "5"]
    async with LocalCluster(nodes, capacity="64MiB", log_level="warning",
                            daemon_args=args) as c:
        with open(c.token_file, "rb") as f:
            token = f.read().strip()
        me = Identity("bench-detection", token, None)
        survivors = c.nodes[:-1]
        victim = c.nodes[-1]
        channels = [Channel((await dial(*parse_address(n.listen), "tool", me))[0])
                    for n in survivors]
        await asyncio.sleep(SETTLE)
        suspected: dict[str, float | None] = {n.node_id: None for n in survivors}
        dead: dict[str, float | None] = {n.node_id: None for n in survivors}

        async def poll(node: str, channel: Channel, start: float) -> None:
            while dead[node] is None and time.monotonic() - start < GIVE_UP:
                try:
                    frame = await channel.request(Stats(), timeout=5.0)
                except HopliteError:
                    await asyncio.sleep(POLL)
                    continue
                now = time.monotonic() - start
                state = {m["node_id"]: m for m in frame.msg.info["members"]}[victim.node_id]
                if state["suspected"] and suspected[node] is None:
                    suspected[node] = now
                if not state["alive"]:
                    dead[node] = now
                    if suspected[node] is None:
                        suspected[node] = now
                await asyncio.sleep(POLL)

        start = time.monotonic()
        os.kill(victim.pid, sig)
        try:
            await asyncio.gather(*(poll(n.node_id, ch, start)
                                   for n, ch in zip(survivors, channels)))
        finally:
            if sig == signal.SIGSTOP:
                os.kill(victim.pid, signal.SIGCONT)
            for ch in channels:
                ch.protocol.close()
        ids = [n.node_id for n in c.nodes]
        return suspected, dead, set(watchers_of(victim.node_id, ids, watchers))


def spread(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    missing = len(values) - len(known)
    if not known:
        return "never"
    text = f"{statistics.median(known):.2f} s ({min(known):.2f}–{max(known):.2f})"
    return text + (f", {missing} never" if missing else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--watchers", default="1024,16",
                        help="comma-separated watcher counts (the daemon's --watchers)")
    parser.add_argument("--signal", choices=["STOP", "KILL"], default="STOP")
    args = parser.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    print("| nodes | watchers | survivors | suspected: its watchers | suspected: the others "
          "| dead: its watchers | dead: the others |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for watchers in (int(w) for w in args.watchers.split(",")):
        suspected, dead, watching = uvloop.run(detect(args.nodes, watchers, sig))
        rows = []
        for table in (suspected, dead):
            rows.append(spread([t for n, t in table.items() if n in watching]))
            others = [t for n, t in table.items() if n not in watching]
            rows.append(spread(others) if others else "–")
        print(f"| {args.nodes} | {watchers} | {len(dead)} | {rows[0]} | {rows[1]} | {rows[2]} "
              f"| {rows[3]} |", flush=True)


if __name__ == "__main__":
    main()
