"""``hoplite soak``: the soak workload against a fresh local cluster, with its verdict."""

from __future__ import annotations

import json

import click
import uvloop

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.units import parse_size
from hoplited.tools.soak import SoakSettings, run_soak


@click.command()
@click.option("--duration", default=120.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds of workload.")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(2, 16))
@click.option("--capacity", default="64MiB", show_default=True, help="Per daemon.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 32),
              help="Concurrent clients per node.")
@click.option("--max-object", default="4MiB", show_default=True)
@click.option("--pressure", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Live objects kept, in units of one store's capacity.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--keep", "workdir", default=None, metavar="DIR",
              help="Keep the daemons' logs in DIR (an existing, empty directory).")
@click.option("--json", "json_path", default=None, help="Write the report to this file.")
def soak(duration: float, nodes: int, capacity: str, workers: int, max_object: str,
         pressure: float, seed: int, workdir: str | None, json_path: str | None) -> None:
    """Puts, broadcasts, reduces, deletes and clients that leave mid-get, at PRESSURE times a
    store's capacity, for DURATION seconds; then checks memory, errors and leftovers
    (docs/operations.md, "Soak"). Exits 1 if a check fails."""
    try:
        settings = SoakSettings(nodes=nodes, capacity=parse_size(capacity), duration=duration,
                                workers=workers, max_object=parse_size(max_object),
                                pressure=pressure, seed=seed)
        settings.check()
        report = uvloop.run(run_soak(settings, workdir))
    except HopliteError as exc:
        raise click.ClickException(str(exc)) from exc
    for line in report.lines():
        click.echo(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    if not report.ok:
        raise SystemExit(1)
