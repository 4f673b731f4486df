"""``hoplite testbed up|down|list``: an emulated cluster that outlives the command (root only).

``up`` builds the namespaces, records them as persistent and exits; ``down`` removes them.
Benchmarks that only need a test bed for their own run use ``hoplited.tools.testbed`` directly
(``hoplite bench ... --emulate RATE``), which removes it when they end.
"""

from __future__ import annotations

import os
import time
from typing import Any

import click
import uvloop

from hoplite_client.wire.errors import HopliteError
from hoplited.tools.testbed import (
    DEFAULT_MTU,
    PREFIX_RE,
    STATE_DIR,
    Testbed,
    TestbedError,
    cleanup_leftovers,
    format_rate,
    parse_rate,
    read_states,
    remove_recorded,
    require_root,
)


def _rate(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        return parse_rate(value)
    except HopliteError as exc:
        raise click.BadParameter(str(exc)) from exc


def _describe(state: dict[str, Any]) -> str:
    age = time.time() - float(state.get("created", time.time()))
    kind = "persistent" if state.get("persistent") else f"pid {state.get('pid')}"
    return (f"{state.get('prefix', '?')}  {state.get('nodes', '?')} hosts, "
            f"{format_rate(float(state.get('rate_bps', 0)))} links, MTU {state.get('mtu', '?')}, "
            f"{kind}, up {age:.0f} s")


@click.group()
def testbed() -> None:
    """Emulated cluster: network namespaces with rate-limited links (needs root)."""


@testbed.command()
@click.argument("nodes", type=click.IntRange(1, 999))
@click.argument("rate", callback=_rate, metavar="RATE")
@click.option("--mtu", default=DEFAULT_MTU, show_default=True, type=click.IntRange(1280, 65535))
@click.option("--check/--no-check", default=False, show_default=True,
              help="Measure every link with TCP before returning.")
def up(nodes: int, rate: int, mtu: int, check: bool) -> None:
    """Create a test bed and keep it until `down`.

    NODES hosts, each linked to a private bridge at RATE (e.g. 1Gbit, 500Mbit) both ways.
    """

    async def build() -> Testbed:
        tb = Testbed(nodes, rate, mtu, persistent=True)
        await tb.up()
        try:
            if check:
                for m in await tb.check_links():
                    click.echo(f"h{m.src} → h{m.dst}: {format_rate(m.bps)}")
        except BaseException:
            tb.down()
            raise
        return tb

    try:
        tb = uvloop.run(build())
    except HopliteError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"test bed {tb.prefix}: {nodes} hosts on {tb.subnet}, {format_rate(rate)} links "
               f"each way, MTU {mtu}")
    for h in tb.hosts:
        click.echo(f"  h{h.index}  netns {h.netns:<18} {h.ip:<15} dev {h.ifname}")
    click.echo(f"run a command in host i:  ip netns exec {tb.prefix}h<i> COMMAND")
    click.echo(f"    e.g.  ip netns exec {tb.hosts[0].netns} ip addr")
    click.echo("remove it:  hoplite testbed down")


@testbed.command()
@click.argument("prefix", required=False)
@click.option("--all", "everything", is_flag=True,
              help="Also test beds of runs that are still going (a running benchmark's).")
def down(prefix: str | None, everything: bool) -> None:
    """Remove test beds made by `up` (or only PREFIX) and those left by crashed runs."""
    try:
        require_root()
        if prefix:
            removed = _down_one(prefix.rstrip("-") + "-")
        else:
            removed = cleanup_leftovers(include_live=everything, include_persistent=True)
    except HopliteError as exc:
        raise click.ClickException(str(exc)) from exc
    for name in removed:
        click.echo(f"removed {name}")
    if not removed:
        click.echo("no test bed to remove")
    left = read_states()
    if left and not everything:
        click.echo(f"{len(left)} test bed(s) of running processes kept (--all removes them)")


def _down_one(prefix: str) -> list[str]:
    if not PREFIX_RE.match(prefix):
        raise TestbedError(f"{prefix!r} is not a test bed name (like hpl-1a2b3c-)")
    path = os.path.join(STATE_DIR, f"{prefix}.json")
    for state_path, state in read_states():
        if state_path == path:
            remove_recorded(state_path, state)
            return [prefix]
    raise TestbedError(f"no test bed {prefix} recorded in {STATE_DIR}")


@testbed.command(name="list")
def list_() -> None:
    """Show the recorded test beds."""
    states = read_states()
    for _, state in states:
        click.echo(_describe(state))
    if not states:
        click.echo("no test bed")
