"""Fencing between registry primaries (cluster/registry/store.py) on a real broker: two
stores that both believe they are primary (a paused primary that missed its demotion) write
one `_schemas` topic; the log decides. A newly elected primary announces a generation above
every earlier one before its first write, and a stale primary's later writes are fenced:
answered 50004, applied by nobody, on replay either. A group whose generations started again
(every instance gone long enough for the coordinator to forget it) still writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from cluster.registry.state import RegistryError, RegistryState
from cluster.registry.store import RegistryStore
from tests.harness import BrokerProcess

TOPIC = "_schemas_fencing"


class ElectedWithoutAsking:
    """An election that says `url` is primary in `generation` and confirms it (what a paused
    primary's own election still says after the group moved on)."""

    def __init__(self, url: str, generation: int) -> None:
        self.url = url
        self.primary_url = url
        self.generation = generation
        self.is_primary = True

    async def wait_decided(self, timeout_s: float) -> bool:
        return True

    async def confirm(self, timeout_s: float) -> bool:
        return True


def schema(name: str) -> str:
    return json.dumps({"type": "record", "name": name, "fields": [{"name": "a", "type": "int"}]})


async def register(store: RegistryStore, subject: str, name: str) -> int:
    answer: int = await store.write(lambda state: state.plan_register(subject, "AVRO", schema(name)))
    return answer


def view(state: RegistryState) -> dict[str, Any]:
    return {s: [(sv.version, sv.schema_id) for sv in state._subject(s).live()] for s in state.subjects()}


def test_a_stale_primary_is_fenced_and_a_forgotten_group_still_writes(broker: BrokerProcess) -> None:
    config = {"bootstrap.servers": broker.bootstrap}

    async def main() -> None:
        a = RegistryStore(config, topic=TOPIC, election=ElectedWithoutAsking("http://a", 2))  # type: ignore[arg-type]
        b = RegistryStore(config, topic=TOPIC, election=ElectedWithoutAsking("http://b", 3))  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            assert await register(a, "fence-x", "X") == 1                # A, primary in generation 2
            assert await register(b, "fence-y", "Y") == 2                # B, elected in 3, announces 3
            with pytest.raises(RegistryError) as fenced:
                await register(a, "fence-z", "Z")                        # A never heard: fenced
            assert (fenced.value.http_status, fenced.value.error_code) == (500, 50004)
            assert a.metrics["writes_fenced"] == 1
            await a.catch_up(30)
            expected = {"fence-x": [(1, 1)], "fence-y": [(1, 2)]}
            assert view(a.state) == view(b.state) == expected
            assert b.state.primary_generation == 3
            # The group was forgotten and elects D in generation 1: D announces 4, above B's 3.
            d = RegistryStore(config, topic=TOPIC, election=ElectedWithoutAsking("http://d", 1))  # type: ignore[arg-type]
            await nursery.start(d.run)
            assert await register(d, "fence-w", "W") == 3
            assert d.state.primary_generation == 4
            with pytest.raises(RegistryError):
                await register(b, "fence-v", "V")                        # now B is the stale one
            replay = RegistryStore(config, topic=TOPIC)
            await nursery.start(replay.run)
            assert view(replay.state) == {**expected, "fence-w": [(1, 3)]}
            assert replay.state.records_fenced == 2
            nursery.cancel_scope.cancel()

    trio.run(main)
