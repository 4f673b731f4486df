"""The ``hoplite`` and ``hoplited`` commands, run as a user would (subprocesses)."""

from __future__ import annotations

import json

import pytest
from helpers import CLI, run


async def test_status_lists_every_member(make_cluster) -> None:
    """``hoplite status`` (socket from $HOPLITE_SOCKET) shows every member alive."""
    cluster = await make_cluster(3)
    code, out, err = await run(*CLI, "status", env={"HOPLITE_SOCKET": cluster.sockets[1]})
    assert code == 0, err
    for node in cluster.nodes:
        assert node.node_id in out and node.listen in out
    assert out.count("alive") == 3
    code, out, _ = await run(*CLI, "status", "--json", "--socket", cluster.sockets[0])
    assert code == 0 and len(json.loads(out)["nodes"]) == 3


async def test_status_without_a_daemon_is_a_clear_error(tmp_path) -> None:
    """No daemon at the socket: exit code 1 and a message naming the socket."""
    sock = str(tmp_path / "nothing.sock")
    code, _, err = await run(*CLI, "status", "--socket", sock)
    assert code == 1 and sock in err and "Traceback" not in err


async def test_bench_broadcast_on_its_own_cluster(tmp_path) -> None:
    """The default bench starts its own cluster, checks every copy and writes JSON."""
    out_file = tmp_path / "result.json"
    code, out, err = await run(*CLI, "bench", "broadcast", "--nodes", "3", "--size", "4MiB",
                               "--repeat", "2", "--capacity", "64MiB", "--json", str(out_file))
    assert code == 0, err
    assert "every result checked" in out and "run 2/2" in out
    result = json.loads(out_file.read_text())
    assert result["op"] == "broadcast" and result["nodes"] == 3 and len(result["runs"]) == 2
    assert result["size"] == 4 * 1024 * 1024 and result["median_s"] > 0


async def test_bench_broadcast_against_an_existing_cluster(make_cluster) -> None:
    """``--join`` benchmarks the members of a running cluster that live on this host."""
    cluster = await make_cluster(3)
    code, out, err = await run(*CLI, "bench", "broadcast", "--join", cluster.seed,
                               "--token-file", cluster.token_file, "--nodes", "3",
                               "--size", "2MiB", "--repeat", "1", "--warmup", "0")
    assert code == 0, err
    assert "to 2 receivers" in out and "every result checked" in out


async def test_bench_join_with_a_wrong_token_fails_cleanly(make_cluster, tmp_path) -> None:
    """A wrong token is reported as an authentication error, not a traceback."""
    cluster = await make_cluster(2)
    bad = tmp_path / "token"
    bad.write_text("not-the-token")
    bad.chmod(0o600)
    code, _, err = await run(*CLI, "bench", "broadcast", "--join", cluster.seed,
                             "--token-file", str(bad), "--repeat", "1")
    assert code != 0 and "token" in err and "Traceback" not in err


async def test_bench_collectives_with_staggered_arrivals(tmp_path) -> None:
    """reduce, allreduce, gather and roundtrip benches run and check their results."""
    for op, extra in [("reduce", ["--arrival-interval", "0.05"]), ("allreduce", []),
                      ("gather", []), ("roundtrip", ["--size", "1KB"])]:
        out_file = tmp_path / f"{op}.json"
        args = ["--size", "2MiB", *extra] if op != "roundtrip" else extra
        code, out, err = await run(*CLI, "bench", op, "--nodes", "3", "--repeat", "2",
                                   "--capacity", "128MiB", "--json", str(out_file), *args)
        assert code == 0, f"{op}: {err}"
        assert "every result checked" in out, op
        assert json.loads(out_file.read_text())["op"] == op


async def test_bench_failure_run_reports_every_survivor(tmp_path) -> None:
    """--kill-node: failure-free runs, then a run in which node 2 is SIGKILLed at once; every
    survivor gets the checked object, and its outcome is printed and recorded."""
    out_json = tmp_path / "failure.json"
    code, out, err = await run(*CLI, "bench", "broadcast", "--nodes", "4", "--size", "16MiB",
                               "--repeat", "2", "--capacity", "256MiB", "--kill-node", "2",
                               "--kill-after", "0", "--json", str(out_json))
    assert code == 0, err
    assert "failure run: SIGKILL to node 2" in out and "(last survivor)" in out, out
    failure = json.loads(out_json.read_text())["failure"]
    assert [o["node"] for o in failure["outcomes"]] == [1, 3]
    assert all(o["error"] is None and o["seconds"] > 0 for o in failure["outcomes"])
    assert failure["kill_after"] == 0 and failure["signal"] == "KILL" and failure["victim"] == 2


async def test_bench_failure_run_of_the_original_holder_owning_the_object(tmp_path) -> None:
    """Broadcast, --kill-node 0 --victim-owns: node 1 copies the object first (in the
    failure-free runs of this shape too), then node 0, its original holder and its owner
    shard, is SIGKILLed at once; nodes 2 and 3 still get the checked object."""
    out_json = tmp_path / "holder.json"
    code, out, err = await run(*CLI, "bench", "broadcast", "--nodes", "4", "--size", "16MiB",
                               "--repeat", "2", "--capacity", "256MiB", "--kill-node", "0",
                               "--kill-after", "0", "--victim-owns", "--json", str(out_json))
    assert code == 0, err
    assert "node 0 is the original holder" in out and "shard owns the object" in out, out
    failure = json.loads(out_json.read_text())["failure"]
    assert [o["node"] for o in failure["outcomes"]] == [2, 3]
    assert all(o["error"] is None for o in failure["outcomes"]), failure
    assert len(failure["failure_free"]) == 2 and failure["victim_owns"] is True


async def test_bench_failure_run_with_a_backup_input(tmp_path) -> None:
    """--backup: the allreduce has one input beyond the first N, put as the run starts; node 2
    is SIGKILLed and every survivor's result is checked against the inputs the reduce says
    it used (the backup, unless the result was complete before the kill)."""
    out_json = tmp_path / "backup.json"
    code, out, err = await run(*CLI, "bench", "allreduce", "--nodes", "4", "--size", "16MiB",
                               "--repeat", "1", "--capacity", "256MiB", "--kill-node", "2",
                               "--kill-after", "0", "--backup", "--json", str(out_json))
    assert code == 0, err
    assert "failure run: SIGKILL to node 2 at 0.00 s, a backup input put" in out, out
    failure = json.loads(out_json.read_text())["failure"]
    assert failure["backup"] is True and [o["node"] for o in failure["outcomes"]] == [0, 1, 3]
    assert all(o["error"] is None for o in failure["outcomes"]), failure


@pytest.mark.parametrize(("args", "says"), [
    (["reduce", "--backup"], "--backup and --victim-owns go with --kill-node"),
    (["broadcast", "--kill-node", "1", "--backup"], "--backup is for reduce and allreduce"),
], ids=["without-kill-node", "not-a-reduce"])
async def test_bench_backup_misuse_is_a_usage_error(args: list[str], says: str) -> None:
    code, _, err = await run(*CLI, "bench", *args, "--nodes", "3")
    assert code == 2 and says in err, err


async def test_bench_failure_run_refuses_the_root() -> None:
    """Node 0 is the op's root: its death is the caller's error, not a survivor's."""
    code, _, err = await run(*CLI, "bench", "reduce", "--nodes", "3", "--kill-node", "0")
    assert code == 2 and "--kill-node must be between 1 and 2" in err
