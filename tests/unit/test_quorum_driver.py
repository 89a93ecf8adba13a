"""Three quorum voters over loopback TCP with real fsync'd storage (cluster/quorum/driver.py)."""

from __future__ import annotations

from pathlib import Path

import trio

from cluster.protocol.internal import internal_payload
from cluster.quorum.driver import NotLeader, QuorumDriver, decode_message, encode_message
from cluster.quorum.raft import Entry, FetchResponse, RaftConfig, Role, Snapshot, VoteRequest
from tests.harness import free_port

CONFIG = RaftConfig(election_timeout_ms=300, fetch_timeout_ms=300, fetch_interval_ms=20, request_timeout_ms=200)


def test_messages_round_trip_through_the_wire_encoding() -> None:
    for msg in (
        VoteRequest(3, 2, 2, 17, True),
        FetchResponse(4, 1, 10, (Entry(4, b"\x00\xffdata"), Entry(4, b"")), 12, snapshot=Snapshot(9, 3, b"img"),
                      request_id=7),
    ):
        frame = encode_message(5, msg)
        assert decode_message(internal_payload(frame[4:])) == (5, msg)


async def _leader(drivers: dict[int, QuorumDriver], *, exclude: int | None = None, timeout_s: float = 10) -> QuorumDriver:
    with trio.fail_after(timeout_s):
        while True:
            leaders = [d for i, d in drivers.items() if i != exclude and d.role is Role.LEADER]
            if len(leaders) == 1:
                return leaders[0]
            await trio.sleep(0.02)


def test_election_commit_failover_and_rejoin(tmp_path: Path) -> None:
    voters = {i: ("127.0.0.1", free_port()) for i in (1, 2, 3)}

    async def main() -> None:
        drivers = {i: QuorumDriver(i, voters, tmp_path / f"voter-{i}", CONFIG, seed=i) for i in voters}
        async with trio.open_nursery() as nursery:
            scopes = {}
            for i, d in drivers.items():
                scopes[i] = trio.CancelScope()

                async def run(d: QuorumDriver = d, scope: trio.CancelScope = scopes[i]) -> None:
                    with scope:
                        await d.run()

                nursery.start_soon(run)
            leader = await _leader(drivers)
            follower = next(d for d in drivers.values() if d is not leader)
            try:
                await follower.propose(b"nope")
                raise AssertionError("a follower accepted a proposal")
            except NotLeader:
                pass
            offsets = [await leader.propose(f"r{i}".encode()) for i in range(50)]
            with trio.fail_after(10):
                for d in drivers.values():
                    await d.wait_committed(offsets[-1])
            datas = [e.data for e in leader.committed_entries() if e.data]
            assert datas == [f"r{i}".encode() for i in range(50)]
            first_epoch = leader.node.epoch if leader.node else -1

            # The leader dies: the other two elect a new one, which commits more.
            scopes[leader.node_id].cancel()
            new_leader = await _leader(drivers, exclude=leader.node_id)
            assert new_leader.node is not None and new_leader.node.epoch > first_epoch
            more = [await new_leader.propose(f"s{i}".encode()) for i in range(20)]
            with trio.fail_after(10):
                await new_leader.wait_committed(more[-1])

            # The old leader restarts from its files and catches up to the same log.
            old_id = leader.node_id
            drivers[old_id] = QuorumDriver(old_id, voters, tmp_path / f"voter-{old_id}", CONFIG, seed=99)
            scopes[old_id] = trio.CancelScope()

            async def rerun() -> None:
                with scopes[old_id]:
                    await drivers[old_id].run()

            nursery.start_soon(rerun)
            with trio.fail_after(10):
                await drivers[old_id].wait_committed(more[-1])
            assert new_leader.node is not None and drivers[old_id].node is not None
            assert drivers[old_id].committed_entries()[: more[-1] + 1] == new_leader.committed_entries()[: more[-1] + 1]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_resigning_leader_is_succeeded_because_it_resigned(tmp_path: Path) -> None:
    """resign() returns once EndQuorumEpoch is on the wire, so a node that stops right after it
    is succeeded by a voter that stood because the leader resigned, not because an election
    timeout passed without word from it (on a loaded machine a fixed pause was too short)."""
    voters = {i: ("127.0.0.1", free_port()) for i in (1, 2, 3)}

    async def main() -> None:
        drivers = {i: QuorumDriver(i, voters, tmp_path / f"voter-{i}", CONFIG, seed=i) for i in voters}
        async with trio.open_nursery() as nursery:
            scopes = {i: trio.CancelScope() for i in voters}
            for i, d in drivers.items():
                async def run(d: QuorumDriver = d, scope: trio.CancelScope = scopes[i]) -> None:
                    with scope:
                        await d.run()

                nursery.start_soon(run)
            leader = await _leader(drivers)
            with trio.fail_after(10):
                await leader.wait_committed(await leader.propose(b"before"))
            await leader.resign()
            scopes[leader.node_id].cancel()  # it exits at once
            new_leader = await _leader(drivers, exclude=leader.node_id)
            assert new_leader.node is not None
            assert new_leader.node.candidacy_cause == f"leader {leader.node_id} resigned", new_leader.node.candidacy_cause
            nursery.cancel_scope.cancel()

    trio.run(main)
