"""``hoplite``: status of a cluster, a local cluster in the foreground, benchmarks, a soak."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import click
import uvloop

import hoplite_client
from hoplite_client.net.endpoints import default_socket
from hoplite_client.wire.errors import HopliteError
from hoplited.tools.cli.bench import bench
from hoplited.tools.cli.options import tls_from, tls_options
from hoplited.tools.cli.simulate import simulate
from hoplited.tools.cli.soak import soak
from hoplited.tools.cli.testbed import testbed
from hoplited.tools.local_cluster import LocalCluster


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Efficient, fault-tolerant collective communication for task-based systems."""


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _status_lines(info: dict[str, Any]) -> list[str]:
    """``hoplite status`` as text: one line per member, then what each is moving."""
    alive = {m["node_id"]: m for m in info["local"]["members"]}
    lines = [f"cluster seen from node {info['local']['node_id']}: "
             f"{sum(m['alive'] for m in alive.values())} live member(s)",
             f"{'node':<14}{'address':<24}{'state':<7}{'objects':>8}{'stored':>12}"
             f"{'in':>12}{'out':>12}"]
    by_id = {n.get("node_id"): n for n in info["nodes"]}
    for node_id, member in alive.items():
        n = by_id.get(node_id, {})
        state = ("dead" if not member["alive"]
                 else "silent" if member.get("suspected") else "alive")
        if "error" in n:
            lines.append(f"{node_id:<14}{member['address']:<24}{state:<7}  ({n['error']})")
            continue
        store = n.get("store", {})
        lines.append(f"{node_id:<14}{member['address']:<24}{state:<7}"
                     f"{store.get('objects', 0):>8}{_human(store.get('stored_bytes', 0)):>12}"
                     f"{_human(n.get('bytes_in', 0)):>12}{_human(n.get('bytes_out', 0)):>12}")
    moving = [(n["node_id"], t) for n in info["nodes"] for t in n.get("transfers", [])]
    if moving:
        lines.append("transfers (object: source -> node, bytes held):")
    for node_id, t in moving:
        size = t.get("size")
        done = "" if not size else f" ({100 * t['received'] / size:.0f}%)"
        lines.append(f"  {t['object'][:16]}: {t.get('source') or '(asking)'} -> {node_id}, "
                     f"{_human(t['received'])} of {_human(size or 0)}{done}")
    lines += _more(info, "transfers")
    slots = [(n["node_id"], s) for n in info["nodes"] for s in n.get("reduce_slots", [])]
    if slots:
        lines.append("reduce slots (reduce slot <- child slots, on node: partial sum so far):")
    for node_id, s in slots:
        children = ", ".join(map(str, s["children"])) or "none"
        lines.append(f"  {s['reduce'][:16]} slot {s['slot']} <- {children}, on {node_id}: "
                     f"{_human(s['computed'])} of {_human(s['size'])}")
    lines += _more(info, "reduce_slots")
    return lines


def _more(info: dict[str, Any], key: str) -> list[str]:
    """A line per node whose record lists only a sample of ``key``: how many it left out."""
    return [f"  ... and {n[key + '_count'] - len(n[key])} more on {n['node_id']}"
            for n in info["nodes"] if n.get(key + "_count", 0) > len(n.get(key, []))]


@main.command()
@click.option("--socket", "socket_path", default=None,
              help="The local daemon's socket [default: $HOPLITE_SOCKET].")
@click.option("--json", "as_json", is_flag=True, help="Print the raw status as JSON.")
@click.option("--watch", default=None, type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Redraw every SECONDS until Ctrl-C: a live view of transfers and reduces.")
def status(socket_path: str | None, as_json: bool, watch: float | None) -> None:
    """Members with their addresses, objects, bytes in/out per node, and what is moving:
    transfers with their progress, reduce slots with their tree edges."""

    async def show(client: hoplite_client.Client, clear: bool) -> None:
        info = await client.status()
        text = json.dumps(info, indent=2) if as_json else "\n".join(_status_lines(info))
        click.echo(("\033[H\033[J" if clear else "") + text)

    async def run() -> None:
        async with await hoplite_client.connect(socket_path or default_socket()) as client:
            await show(client, clear=watch is not None)
            while watch is not None:
                await asyncio.sleep(watch)
                await show(client, clear=True)

    try:
        uvloop.run(run())
    except HopliteError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass


@main.command()
@click.option("--nodes", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option("--capacity", default="2GiB", show_default=True, help="Per daemon.")
@tls_options
def cluster(nodes: int, capacity: str, tls_cert: str | None, tls_key: str | None,
            tls_ca: str | None) -> None:
    """Run a local cluster of NODES daemons on loopback until Ctrl-C (over mutual TLS with
    the TLS options)."""
    tls = tls_from(tls_cert, tls_key, tls_ca)

    async def run() -> None:
        async with LocalCluster(nodes, capacity=capacity, tls=tls) as c:
            for n in c.nodes:
                click.echo(f"node {n.index}: {n.node_id} {n.listen} socket {n.socket} "
                           f"pid {n.pid}")
            click.echo(f"export HOPLITE_SOCKET={c.nodes[0].socket}   # Ctrl-C stops the cluster")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()

    try:
        uvloop.run(run())
    except HopliteError as exc:
        raise click.ClickException(str(exc)) from exc


main.add_command(bench)
main.add_command(simulate)
main.add_command(soak)
main.add_command(testbed)

if __name__ == "__main__":
    sys.exit(main())
