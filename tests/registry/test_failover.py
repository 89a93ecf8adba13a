"""Several registry instances on one cluster (tests/registry/test_clients.py's registry is
stopped by then: this module's instances are the group's only members): the primary is
elected through the cluster, the others forward writes, a primary killed with SIGKILL is
replaced, and no id is ever reused."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.harness import BrokerProcess
from tests.registry.common import RegistryProcess


def client(reg: RegistryProcess) -> SchemaRegistryClient:
    """A new client (its caches empty), so answers come from the registry."""
    return SchemaRegistryClient({"url": reg.url})


def test_two_instances_forward_fail_over_and_rebuild(broker: BrokerProcess, tmp_path: Path) -> None:
    """Two instances: writes to either land (the secondary forwards to the primary), the
    primary killed with SIGKILL while writes are in flight through both hands over to the
    other, which goes on without reusing an id; every acknowledged write is kept, and the
    killed one restarted rebuilds the same state from `_schemas`."""
    regs = [RegistryProcess(tmp_path / f"registry-{n}.log", bootstrap=broker.bootstrap).launch() for n in "ab"]
    try:
        for reg in regs:
            reg.wait_ready()
        ids = []
        for i in range(6):
            writer = regs[i % 2]
            ids.append(client(writer).register_schema(f"ha-{i}-value", Schema(json.dumps(
                {"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "int"}]}), "AVRO")))
            # read-your-writes on the instance that answered, forwarded or not
            assert client(writer).get_latest_version(f"ha-{i}-value").schema_id == ids[-1]
        assert len(set(ids)) == 6
        sr = client(regs[0])
        sr.delete_subject("ha-5-value")
        sr.delete_subject("ha-5-value", permanent=True)          # the highest id's only holder
        primary = next(r for r in regs if r.is_primary())
        survivor = next(r for r in regs if r is not primary)
        acked: dict[str, int] = {}
        stop = threading.Event()

        def write_in_flight(reg: RegistryProcess, tag: str) -> None:
            sr = SchemaRegistryClient({"url": reg.url, "max.retries": 0})   # an error is an answer
            n = 0
            while not stop.is_set():
                subject = f"fly-{tag}-{n}-value"
                try:
                    acked[subject] = sr.register_schema(subject, Schema(json.dumps(
                        {"type": "record", "name": f"F{tag}{n}", "fields": [{"name": "f", "type": "int"}]}), "AVRO"))
                except Exception:  # noqa: BLE001 - unacknowledged: the instance died or no primary yet
                    time.sleep(0.05)
                n += 1

        writers = [threading.Thread(target=write_in_flight, args=(r, t), daemon=True)
                   for r, t in ((primary, "p"), (survivor, "s"))]
        for w in writers:
            w.start()
        while len(acked) < 4:                                  # writes are flowing through both
            time.sleep(0.01)
        primary.kill9()
        killed_at = time.monotonic()
        deadline = killed_at + 30
        new_id = None
        while new_id is None:
            try:
                new_id = client(survivor).register_schema("ha-after-value", Schema(json.dumps(
                    {"type": "record", "name": "After", "fields": [{"name": "g", "type": "long"}]}), "AVRO"))
            except SchemaRegistryError as exc:
                # the dead primary unreachable (50003), no primary yet (50004)
                assert exc.error_code in (50003, 50004) and time.monotonic() < deadline, exc
        failover_s = time.monotonic() - killed_at
        stop.set()
        joined_at = time.monotonic()
        for w in writers:
            w.join(timeout=60)
        print(f"{len(acked)} writes acknowledged while writing through both; joined in "
              f"{time.monotonic() - joined_at:.1f} s")
        assert new_id > max(ids), (new_id, ids)
        assert survivor.is_primary()
        primary.start()
        fresh = client(primary)
        subjects = fresh.get_subjects()
        assert "ha-after-value" in subjects and "ha-5-value" not in subjects
        assert [fresh.get_latest_version(f"ha-{i}-value").schema_id for i in range(5)] == ids[:5]
        # every acknowledged write is there with the id it was answered, and ids are distinct
        for subject, schema_id in acked.items():
            assert fresh.get_latest_version(subject).schema_id == schema_id, subject
        all_ids = [*ids[:5], new_id, *acked.values()]
        assert len(set(all_ids)) == len(all_ids)
        print(f"failover (SIGKILL of the primary to a write through the other instance): {failover_s:.1f} s")
    finally:
        for reg in regs:
            reg.stop()
