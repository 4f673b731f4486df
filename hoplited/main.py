"""``hoplited``: run one daemon (object store + directory shard) for this host."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable

import click
import uvloop

from hoplite_client.daemon_process import EXIT_NO_PEER
from hoplite_client.net.endpoints import default_socket, default_token, parse_address, read_token
from hoplite_client.wire.errors import HopliteError, UnreachableError
from hoplite_client.wire.units import parse_size
from hoplited.collectives.tree import TWO_TREE_MODES
from hoplited.config import DaemonConfig
from hoplited.logs import FORMATS, log_to_stderr
from hoplited.node import Daemon
from hoplited.threads import started_executor

log = logging.getLogger("hoplited")

# How often a daemon started with --exit-with-parent (--exit-when-unused) checks that its
# parent still runs (that a user still holds the lock).
PARENT_POLL = 0.5


# Where a daemon declared dead joins again, across its exec (HOST:PORT,HOST:PORT...): tried
# before any --join (docs/design.md §5, "Declared dead, then running again").
REJOIN_ENV = "HOPLITED_REJOIN"


async def run(config: DaemonConfig, exit_with_parent: bool = False,
              users_lock: str | None = None) -> list[tuple[str, int]] | None:
    """Start the daemon, print its ready line, serve until SIGTERM/SIGINT (or, with
    ``exit_with_parent``, until the process that started us is gone; with ``users_lock``,
    until no process holds that file locked), then shut down. Returns where to join again
    if a member declared us dead, else None."""
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(started_executor())  # closed by the runner when the loop ends
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    # Both watches are cancelled with the daemon's other tasks when it stops.
    if exit_with_parent:
        daemon.tasks.spawn(watch_parent(os.getppid(), daemon.request_stop), name="parent")
    if users_lock is not None:
        fd = os.open(users_lock, os.O_RDWR | os.O_CREAT, 0o600)
        daemon.tasks.spawn(watch_users(fd, daemon.request_stop), name="users")
    try:
        await daemon.start()
        print(daemon.ready_line(), flush=True)
        await daemon.serve_forever()
    finally:
        await daemon.stop()
    return daemon.rejoin


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, and return it: a
    member keeps about four connections to every other member (docs/design.md §5, "Links
    dialled at a join"), past the usual soft limit of 1024 from about 250 members."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard,
                        exc)
            return soft
        return hard
    return soft


def run_again(seeds: list[tuple[str, int]]) -> None:
    """Replace this process by a fresh daemon with the same arguments, which joins through
    ``seeds`` first: a new node id, an empty store, the same pid, socket path and logs."""
    os.environ[REJOIN_ENV] = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}"
                                      for h, p in seeds)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


async def watch_parent(parent: int, stop: Callable[[], None]) -> None:
    """Call ``stop`` once our parent process has gone: we were handed to another (init, or a
    subreaper), so ``getppid`` no longer names it. A supervisor that is killed outright (a
    Ray actor, with its node) takes its daemon with it this way."""
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_POLL)
    log.warning("the process that started us (pid %d) is gone: stopping", parent)
    stop()


async def watch_users(fd: int, stop: Callable[[], None]) -> None:
    """Call ``stop`` once no process holds a shared lock on ``fd``'s file: the users (the Dask
    workers of hoplite_client.dask) hold one while they may use us, and the kernel drops it
    when they die. We keep the exclusive lock until we exit, so a user that comes meanwhile
    waits and then starts a new daemon (docs/quickstart.md)."""
    while True:
        await asyncio.sleep(PARENT_POLL)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        log.warning("no process uses us any more (nobody holds the lock): stopping")
        stop()
        return


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen", default="127.0.0.1:0", show_default=True,
              help="HOST:PORT for peers (port 0: any free port, printed in the ready line).")
@click.option("--socket", "socket_path", default=None,
              help="Unix socket for local clients [default: $HOPLITE_SOCKET or "
                   "/tmp/hoplite-UID/hoplited.sock].")
@click.option("--join", multiple=True, metavar="HOST:PORT",
              help="Any existing member; the full membership is learnt from it. Repeatable.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
              help="File holding the cluster's shared secret; every daemon of a cluster "
                   "reads a copy of the same file [default: $HOPLITE_TOKEN_FILE, or token in "
                   "$XDG_RUNTIME_DIR/hoplite or /tmp/hoplite-UID, made with a random token if "
                   "missing].")
@click.option("--insecure", is_flag=True,
              help="No token: accept every peer and tool that reaches --listen (on loopback, "
                   "every user of this host), which can then read every object. Not with "
                   "--token-file.")
@click.option("--capacity", default=None, help="Object store size, e.g. 8GiB [default: half "
                                                 "of RAM].")
@click.option("--fanout", default=1, show_default=True, type=int,
              help="Transfers one holder serves per object at once.")
# The schedules' own switches (hidden): the chooser decides them; benches and tests that
# compare a schedule with its alternative set them (docs/design.md §3, §4).
@click.option("--two-trees", default="auto", show_default=True, hidden=True,
              type=click.Choice(TWO_TREE_MODES),
              help="When a reduce of every input, or a broadcast whose gets say how many "
                   "they are, runs as two trees of halves: where the link model says they "
                   "pay, always, or never (docs/design.md §3, §4).")
@click.option("--ring-wait", default=0.1, show_default=True, type=float, hidden=True,
              help="Seconds an allreduce waits for each next input, to run them all as a "
                   "ring, and less where the ring saves less (docs/design.md §4); 0: never "
                   "a ring.")
@click.option("--pair/--no-pair", default=True, show_default=True, hidden=True,
              help="Let an allreduce whose inputs come further apart than the ring's wait "
                   "end as a pair of combiners, one per half (docs/design.md §4).")
@click.option("--pair-min-transfer", default=DaemonConfig.pair_min_transfer, show_default=True,
              hidden=True, type=float,
              help="Seconds an object must take to cross a link for a pair (docs/design.md "
                   "§4, \"A pair for the last two inputs\"); 0: at any size.")
@click.option("--merge/--no-merge", default=True, show_default=True, hidden=True,
              help="Let a reduce's slot add the other inputs ready on its node, so that the "
                   "node's link carries one stream (docs/design.md §4, \"Several inputs on "
                   "one node\").")
@click.option("--tcp-congestion", "tcp_congestion", default=DaemonConfig.congestion,
              show_default=True, metavar="NAME",
              help="TCP congestion control of the connections between daemons (one the "
                   "kernel has and allows); '' keeps the system's (docs/design.md §3, "
                   "\"Congestion control\").")
@click.option("--advertise", default=None, help="Address peers should use to reach us.")
@click.option("--heartbeat-interval", default=0.5, show_default=True, type=float)
@click.option("--heartbeat-timeout", default=5.0, show_default=True, type=float,
              help="Seconds of silence after which a member is declared dead.")
@click.option("--suspect-after", default=1.0, show_default=True, type=float,
              help="Seconds a Ping may go unanswered before the member is suspected: nothing "
                   "waits on it, though it stays a member (docs/design.md §5); 0: never.")
@click.option("--watchers", default=16, show_default=True, type=int,
              help="Members that ping each member every heartbeat interval; the others ask "
                   "it only on a watcher's alarm, so heartbeats stay flat as the cluster "
                   "grows (docs/design.md §5, \"Watchers\"). At most this + 1 members: "
                   "everyone pings everyone.")
@click.option("--stall-timeout", default=30.0, show_default=True, type=float,
              help="Longest a transfer may receive nothing before it switches source (a "
                   "get's window is derived from the measured link rate: about 1 s on 1 Gbit "
                   "links; a reduce's pulls use this cap).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(FORMATS),
              help="json: one JSON object per line, for a log pipeline (docs/operations.md).")
@click.option("--metrics-port", default=None, type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics on this port of the --listen host (0: any free "
                   "port, in the ready line); docs/operations.md.")
@click.option("--tls-cert", default=None, metavar="FILE",
              help="This node's certificate (PEM), signed by --tls-ca. With --tls-key and "
                   "--tls-ca: every peer connection runs over mutual TLS (docs/security.md).")
@click.option("--tls-key", default=None, metavar="FILE",
              help="The private key of --tls-cert (PEM, unencrypted, readable by us only).")
@click.option("--tls-ca", default=None, metavar="FILE",
              help="The cluster's CA certificate (PEM): the only issuer peers' certificates "
                   "may have.")
@click.option("--exit-with-parent", is_flag=True,
              help="Stop when the process that started us is gone (a supervisor such as "
                   "the Ray actor of hoplite_client.ray, killed with its node).")
@click.option("--exit-when-unused", "users_lock", default=None, metavar="FILE",
              help="Stop once no process holds a shared flock on FILE (the workers of one "
                   "host sharing this daemon, as hoplite_client.dask's do).")
def main(listen: str, socket_path: str | None, join: tuple[str, ...],
         token_file: str | None, insecure: bool, capacity: str | None, fanout: int,
         two_trees: str, ring_wait: float, pair: bool, pair_min_transfer: float,
         merge: bool, tcp_congestion: str, advertise: str | None,
         heartbeat_interval: float,
         heartbeat_timeout: float,
         suspect_after: float, watchers: int, stall_timeout: float, log_level: str,
         log_format: str,
         metrics_port: int | None, tls_cert: str | None, tls_key: str | None,
         tls_ca: str | None, exit_with_parent: bool, users_lock: str | None) -> None:
    """Run the hoplite daemon for this host."""
    log_to_stderr(log_level, log_format)
    log.info("open files limit: %d", raise_open_files_limit())
    rejoin = [a for a in os.environ.pop(REJOIN_ENV, "").split(",") if a]
    if rejoin:
        log.warning("running again as a new member, after a member declared us dead")
    try:
        host, port = parse_address(listen)
        config = DaemonConfig(host=host, port=port, socket_path=socket_path or default_socket(),
                              join=[parse_address(j) for j in (*rejoin, *join)],
                              insecure=insecure,
                              fanout=fanout, two_trees=two_trees, ring_wait=ring_wait,
                              pair=pair, pair_min_transfer=pair_min_transfer, merge=merge,
                              congestion=tcp_congestion,
                              heartbeat_interval=heartbeat_interval,
                              heartbeat_timeout=heartbeat_timeout,
                              suspect_after=suspect_after or None, watchers=watchers,
                              stall_timeout=stall_timeout,
                              advertise_host=advertise, metrics_port=metrics_port,
                              tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca)
        if capacity is not None:
            config.capacity = parse_size(capacity)
        if token_file is not None:
            config.token_file, config.token = os.path.abspath(token_file), read_token(token_file)
        elif not insecure:
            config.token_file, config.token = default_token()
        seeds = uvloop.run(run(config, exit_with_parent, users_lock))
    except UnreachableError as exc:  # no --join peer could be reached at all
        click.echo(f"hoplited: {exc}", err=True)
        sys.exit(EXIT_NO_PEER)
    except HopliteError as exc:
        click.echo(f"hoplited: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        click.echo(f"hoplited: {exc}", err=True)
        sys.exit(1)
    if seeds is not None:
        run_again(seeds)
