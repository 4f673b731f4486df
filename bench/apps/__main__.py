"""``python -m bench.apps --smoke`` (``make apps``): every app on plain Ray and on Ray + Hoplite,
and a table of the results.

On this machine the runs share one local Ray cluster; with ``--emulate RATE`` each run is the
app's own command (``python -m bench.apps.<app> ... --emulate RATE``), which builds its own
test bed and Ray cluster. The other options (``--nodes``, ``--size``, ``--iterations``,
``--kill-node``, ``--kill-after``, ``--timeout``, ``--capacity``, ``--emulate``) go to every
app as they are. Each result is also printed to stderr as the app prints it, and with
``--json PATH`` written there.
Usage: python -m bench.apps [--smoke] [--systems ray,hoplite] [--apps async_sgd,...]
       [--json PATH] [app options]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from bench.apps.common import LocalRayCluster
from bench.apps.suite import APPS, app_args, run_suite, table
from bench.apps.transport import SYSTEMS
from bench.baselines.common import REPO_ROOT, module_command


def local(systems: Sequence[str], apps: Sequence[str],
          argv: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The runs in one local Ray cluster."""
    first = app_args(apps[0], systems[0], argv)
    cluster = LocalRayCluster(first.nodes, store=first.store)
    # Ray prints what its processes report to the driver's stdout: to stderr with it.
    with contextlib.redirect_stdout(sys.stderr):
        cluster.start()
        try:
            yield from run_suite(cluster, systems, apps, argv)
        finally:
            cluster.stop()


def one_by_one(systems: Sequence[str], apps: Sequence[str],
               argv: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The runs as separate commands, each with its own cluster."""
    for system in systems:
        for app in apps:
            out = subprocess.run([*module_command(f"bench.apps.{app}"), "--system", system,
                                  *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                                 check=True).stdout
            yield json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--json", default=None, help="write the results here too")
    args, argv = parser.parse_known_args()
    systems, apps = args.systems.split(","), args.apps.split(",")
    for name, known, given in (("systems", SYSTEMS, systems), ("apps", tuple(APPS), apps)):
        if not set(given) <= set(known):
            parser.error(f"--{name}: pick among {', '.join(known)}")
    runs = one_by_one if app_args(apps[0], systems[0], argv).emulate else local
    results = []
    for result in runs(systems, apps, argv):
        print(json.dumps(result), file=sys.stderr, flush=True)
        results.append(result)
    print(table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
