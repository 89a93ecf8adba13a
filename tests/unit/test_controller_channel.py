"""A broker's ISR changes on their way to the controller (cluster/broker/controller_channel.py):
the changes asked for while a call is in flight travel together in the next call.

In the mirror fault test a broker whose followers had all been fenced led ~100 partitions
below min.insync.replicas; their expansions went one call (one commit) each, in a row, and
the last waited ~40 s, refusing acks=all writes meanwhile (the transaction coordinator's
among them, so a producer's transaction ran into its timeout)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from cluster.broker.controller_channel import ControllerChannel
from cluster.controller.service import ControllerUnavailable
from cluster.protocol.errors import ErrorCode
from cluster.replication.partition import AlterIsr

CHANGES = 100


def change(partition: int) -> AlterIsr:
    return AlterIsr("t", partition, "topic-id", 0, 3, (1, 2), "expand with 2")


def code_for(partition: int) -> int:
    """What the fake controller answers for a partition: some refused, some stale, most done."""
    return (ErrorCode.none, ErrorCode.invalid_update_version, ErrorCode.ineligible_replica)[partition % 3]


class Controller:
    """Stands in for MetadataService: answers calls, holding the first until `release`."""

    def __init__(self, *, knows_alter_partitions: bool = True, unavailable: bool = False) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.release = trio.Event()
        self.knows_alter_partitions = knows_alter_partitions
        self.unavailable = unavailable
        self.applied: list[int] = []

    async def call(self, op: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        assert (args["broker_id"], args["broker_epoch"]) == (1, 7)
        items = args["partitions"] if op == "alter_partitions" else [args]
        self.calls.append((op, [item["partition"] for item in items]))
        if len(self.calls) == 1:
            await self.release.wait()
        if self.unavailable:
            raise ControllerUnavailable("no active controller answered alter_partitions within 10.0 s")
        if op == "alter_partitions" and not self.knows_alter_partitions:
            return {"error_code": ErrorCode.invalid_request,
                    "error_message": "unknown controller operation 'alter_partitions'"}
        answers = [{"error_code": code_for(item["partition"])} for item in items]
        if op == "alter_partition":
            return {**answers[0], "metadata_offset": 10 + len(self.calls)}
        return {"error_code": ErrorCode.none, "partitions": answers, "metadata_offset": 10 + len(self.calls)}

    async def wait_for_offset(self, offset: int) -> None:
        self.applied.append(offset)


def send_all(controller: Controller) -> dict[int, int | str]:
    """CHANGES partitions' leaders each ask for an ISR change while the first call is in
    flight; what each is answered (a code, or the ControllerUnavailable it raised)."""
    channel = ControllerChannel(controller, 1, lambda: 7)  # type: ignore[arg-type]
    answers: dict[int, int | str] = {}

    async def alter(partition: int) -> None:
        try:
            answers[partition] = await channel.alter_partition(change(partition))
        except ControllerUnavailable as exc:
            answers[partition] = str(exc)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for p in range(CHANGES):
                nursery.start_soon(alter, p)
            await trio.testing.wait_all_tasks_blocked()
            controller.release.set()

    trio.run(main)
    return answers


def test_isr_changes_asked_for_during_a_call_go_together_in_the_next() -> None:
    controller = Controller()
    answers = send_all(controller)
    assert len(controller.calls) == 2
    (op1, first), (op2, rest) = controller.calls
    assert (op1, op2) == ("alter_partitions", "alter_partitions")
    assert len(first) == 1 and sorted(first + rest) == list(range(CHANGES))
    assert answers == {p: code_for(p) for p in range(CHANGES)}
    assert controller.applied == [11, 12]  # each answer waits until this broker applied its commit


def test_a_controller_without_alter_partitions_gets_them_one_by_one() -> None:
    controller = Controller(knows_alter_partitions=False)
    answers = send_all(controller)
    assert answers == {p: code_for(p) for p in range(CHANGES)}
    ops = [op for op, _ in controller.calls]
    # Asked once per call in flight, then not again: every later change goes alone.
    assert ops[0] == "alter_partitions" and ops[1] == "alter_partition"
    assert ops.count("alter_partitions") == 1 and ops.count("alter_partition") == CHANGES
    assert sorted(p for op, ps in controller.calls if op == "alter_partition" for p in ps) == list(range(CHANGES))


def test_every_change_of_an_unanswered_call_is_told_so() -> None:
    controller = Controller(unavailable=True)
    answers = send_all(controller)
    assert len(controller.calls) == 2
    assert set(answers.values()) == {"no active controller answered alter_partitions within 10.0 s"}
    assert sorted(answers) == list(range(CHANGES))
