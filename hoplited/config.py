"""Daemon settings, with the reasoning behind each default."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from hoplite_client.net import congestion
from hoplite_client.net.endpoints import default_socket, is_loopback
from hoplite_client.net.tls import TlsContexts, TlsFiles, load, tls_files
from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.collectives.choose import PAIR_MIN_TRANSFER
from hoplited.collectives.tree import TWO_TREE_MODES

log = logging.getLogger("hoplited")

# A ring that waits longer than this for its inputs would hold stripes back for no gain.
MAX_RING_WAIT = 60.0
# No link takes a minute to carry an object a pair is for: a larger least transfer is a typo.
MAX_PAIR_MIN_TRANSFER = 60.0
# Watchers per member at most: more would be a full mesh in any cluster one could run here.
MAX_WATCHERS = 1024


def host_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_capacity() -> int:
    """Half the machine's memory: the arena is sparse, so this costs nothing until used."""
    return host_memory() // 2


@dataclass
class DaemonConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: the kernel picks; the ready line on stdout says which
    socket_path: str = field(default_factory=default_socket)
    join: list[tuple[str, int]] = field(default_factory=list)
    # The secret every peer and tool proves it knows; empty only with ``insecure``, the one
    # way to accept anyone who reaches the port.
    token: bytes = b""
    # Where the token came from (--token-file or the default file), for the ready line.
    token_file: str | None = None
    insecure: bool = False
    capacity: int = field(default_factory=default_capacity)
    # The artifact serves one transfer per object per node; chains then cost one hop each,
    # which cut-through forwarding makes cheap. Raise it to trade depth for uplink sharing.
    fanout: int = 1
    # When a reduce of every input runs as two trees of halves (docs/design.md §4): where the
    # link model says they pay, "always" (for tests and benchmarks) or "never".
    two_trees: str = "auto"
    # How long a striped allreduce waits, from its first ready input, for all the others to
    # run them as a ring (docs/design.md §4, "Ring allreduce"); 0: never a ring. Callers that
    # put at once are ready within a few ms of each other; inputs 0.1 s apart go in stripes.
    ring_wait: float = 0.1
    # Whether an allreduce whose inputs come further apart than the ring's wait holds them
    # until two are missing, for a pair of combiners (docs/design.md §4, "A pair for the
    # last two inputs").
    pair: bool = True
    # The least time, in seconds, an object must take to cross a link for a pair; 0 lets
    # a loopback cluster, where objects cross in milliseconds, take one (tests).
    pair_min_transfer: float = PAIR_MIN_TRANSFER
    # Whether a reduce's slot adds the other inputs ready on its node while it has combined
    # nothing, so the node's link carries one stream (docs/design.md §4, "Several inputs on
    # one node"); off only to measure against.
    merge: bool = True
    # The TCP congestion control of the connections between daemons; "": the system's.
    # Cubic, since BBR (v1) loses the tails of streams where three or more meet on one link
    # of shallow queues, and each such loss waits out a retransmission timeout
    # (docs/design.md §3, "Congestion control").
    congestion: str = congestion.DEFAULT
    # Twice a second: a Ping to each member is a small frame, and a frozen member's Ping
    # goes unanswered at most half a second sooner (suspicion, below).
    heartbeat_interval: float = 0.5
    # Five missed beats: long enough for a loaded 2-core test machine, short enough to react.
    heartbeat_timeout: float = 5.0
    # A member whose Ping is unanswered this long is suspected: nothing waits on it any more,
    # though it stays a member (docs/design.md §5). A loaded host answers within tens of ms;
    # a false suspicion costs redone work, never a wrong result. None: no suspicion.
    suspect_after: float | None = 1.0
    # Each member is pinged every interval by this many others (its watchers); the rest ask
    # it only on an alarm from one of them or when their connection to it closes, so a
    # member's heartbeat work stays flat as the cluster grows (docs/design.md §5, "Watchers").
    # Clusters of at most watchers + 1 members: everyone pings everyone.
    watchers: int = 16
    # The longest a pull may receive nothing before it is abandoned and resumed from another
    # source; a get's own window is derived from the link rate below this cap (link_model.py).
    stall_timeout: float = 30.0
    advertise_host: str | None = None
    # Prometheus metrics on this port of ``host`` (docs/operations.md); None: not served.
    metrics_port: int | None = None
    # PEM files for mutual TLS on every TCP connection (docs/security.md); all or none.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    @property
    def tls_files(self) -> TlsFiles | None:
        """The three TLS files, or None for plain TCP; one or two of them is refused."""
        return tls_files(self.tls_cert, self.tls_key, self.tls_ca)

    def tls_contexts(self) -> TlsContexts | None:
        """The SSL contexts built from the files (each one read and checked), or None."""
        files = self.tls_files
        return None if files is None else load(files)

    def check(self) -> None:
        """Refuse settings that would be unsafe or meaningless."""
        tls_files(self.tls_cert, self.tls_key, self.tls_ca)  # all three or none
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgumentError(f"metrics port must be within 0..65535, "
                                       f"not {self.metrics_port}")
        memory = host_memory()
        if not 0 < self.capacity <= memory:
            raise InvalidArgumentError(
                f"capacity {self.capacity} bytes does not fit this host's memory ({memory} "
                f"bytes): the store would fail once filled", limit=memory)
        if self.fanout < 1:
            raise InvalidArgumentError("fanout must be at least 1")
        if self.two_trees not in TWO_TREE_MODES:
            raise InvalidArgumentError(f"two-trees must be one of {', '.join(TWO_TREE_MODES)}")
        if not 0 <= self.ring_wait <= MAX_RING_WAIT:  # also refuses NaN
            raise InvalidArgumentError(f"ring wait must be within 0..{MAX_RING_WAIT} seconds")
        if not 0 <= self.pair_min_transfer <= MAX_PAIR_MIN_TRANSFER:  # also refuses NaN
            raise InvalidArgumentError(
                f"pair min transfer must be within 0..{MAX_PAIR_MIN_TRANSFER} seconds")
        try:
            congestion.check_name(self.congestion)
        except ValueError as exc:
            raise InvalidArgumentError(f"--tcp-congestion: {exc}") from None
        if not self.heartbeat_interval > 0:  # also refuses NaN
            raise InvalidArgumentError("heartbeat interval must be positive")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise InvalidArgumentError("heartbeat timeout must exceed the heartbeat interval")
        if not 1 <= self.watchers <= MAX_WATCHERS:
            raise InvalidArgumentError(f"--watchers must be between 1 and {MAX_WATCHERS}")
        if self.suspect_after is not None and not 0 < self.suspect_after < self.heartbeat_timeout:
            raise InvalidArgumentError("--suspect-after must be positive and below the heartbeat "
                                       "timeout (0 turns suspicion off)")
        self._check_token()

    def _check_token(self) -> None:
        """A token, or ``insecure`` and none; an address that does not resolve is refused too,
        as the reach of an insecure daemon is decided on its addresses."""
        loopback = is_loopback(self.host)
        if self.insecure and self.token:
            raise InvalidArgumentError("--insecure accepts peers without a token, and a "
                                       "--token-file requires it: pass one or the other")
        if not self.insecure and not self.token:
            raise InvalidArgumentError("no cluster token: pass --token-file (hoplited makes a "
                                       "default one without it), or --insecure")
        if self.insecure:
            reach = "every user of this host" if loopback else f"anyone who reaches {self.host}"
            log.warning("--insecure: peers join without a token, so %s can join the cluster "
                        "and read every object", reach)
