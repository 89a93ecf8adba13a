"""Who may pause a flow is what the target's brokers allow (mirror/flow_control.py): a secured
broker (StandardAuthorizer, SCRAM over SASL_SSL) where alice may only READ
dcmirror.flow-control and bob may only WRITE it. Refusals come from the broker and are raised
as FlowControlDenied naming the topic, the cluster and the ACL to add."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from mirror.flow_control import (
    FLOW_CONTROL_TOPIC,
    FlowControl,
    FlowControlDenied,
    read_flow_controls,
    set_flow_paused,
)
from tests.security.secured import (
    ClientSecurity,
    SecuredBroker,
    create_acls,
    secured_broker_with_users,
)

FLOW = "east-to-aggregate"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with secured_broker_with_users(tmp_path_factory.mktemp("flow-control")) as broker:
        create_acls({"bootstrap.servers": broker.internal}, [
            ("TOPIC", FLOW_CONTROL_TOPIC, "LITERAL", "User:alice", "READ", "ALLOW"),
            ("TOPIC", FLOW_CONTROL_TOPIC, "LITERAL", "User:bob", "WRITE", "ALLOW"),
        ])
        yield broker


def pause(client: dict[str, Any], paused: bool, reason: str = "", at_ms: int = 1_000) -> FlowControl:
    return trio.run(lambda: set_flow_paused(client, FLOW, paused, reason, now_ms=at_ms, cluster_name="aggregate"))


def read(client: dict[str, Any]) -> dict[str, FlowControl]:
    return trio.run(lambda: read_flow_controls(client, cluster_name="aggregate"))


@pytest.mark.timeout(120)
def test_only_a_principal_allowed_to_write_the_control_topic_pauses_a_flow(secured: SecuredBroker) -> None:
    alice = ClientSecurity(secured, "SCRAM-SHA-512", "alice").dcmirror()
    bob = ClientSecurity(secured, "SCRAM-SHA-512", "bob").dcmirror()
    root = {"bootstrap.servers": secured.internal}  # ANONYMOUS on the internal listener: a super user

    assert read(alice) == {}, "no topic yet: no flow is paused"
    with pytest.raises(FlowControlDenied, match=f"allowing Create on topic {FLOW_CONTROL_TOPIC}"):
        pause(bob, True, "before the topic exists")  # bob may write it, not create it
    assert pause(root, False) == FlowControl(False, 1_000, "")  # as a worker's first start would, it creates it

    with pytest.raises(FlowControlDenied) as refused:
        pause(alice, True, "alice tries")
    text = str(refused.value)
    for part in ("pausing flow east-to-aggregate", "cluster aggregate", "TOPIC_AUTHORIZATION_FAILED",
                 f"an ACL allowing Write on topic {FLOW_CONTROL_TOPIC}", "dcmirror acls add"):
        assert part in text, (part, text)
    assert read(alice)[FLOW] == FlowControl(False, 1_000, ""), "the refused write left nothing"

    assert pause(bob, True, "maintenance", at_ms=2_000) == FlowControl(True, 2_000, "maintenance")
    assert read(alice) == {FLOW: FlowControl(True, 2_000, "maintenance")}
    with pytest.raises(FlowControlDenied, match=f"allowing Read on topic {FLOW_CONTROL_TOPIC}"):
        read(bob)  # WRITE alone: the broker refuses the Fetch
    assert pause(bob, False, at_ms=3_000) == FlowControl(False, 3_000, "")
    assert read(alice)[FLOW] == FlowControl(False, 3_000, "")
