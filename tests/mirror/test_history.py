"""The mirror checks the history of both sides as a follower does (mirror/history.py), with
real broker and worker processes:

- a source topic deleted and created again under a running flow (a new topic id, offsets
  from 0): the new incarnation's records all arrive after the old one's, once, with their
  topic id in the provenance, a WARNING and the re-creation counted; then a worker killed -9
  in the middle of the new incarnation's traffic loses and doubles nothing;
- an unclean leader election at the source (3 brokers, 3 controllers, replicas [1, 2]): the
  records the new leader lacks stay in the aggregate and are reported as a divergence with
  their range, and the source's new records at those offsets are mirrored; then the topic is
  created again, and a warehouse load holds every row of the three histories once, told
  apart by source topic id and leader epoch (partition and offset alone would merge them);
- the aggregate topic deleted under a running flow: re-created and refilled from the source.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import NewTopic

from mirror import provenance
from tests.cluster_helpers import NotYet, admin, metadata_from, partitions_of
from tests.harness import REPO
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    Rec,
    SourceWriter,
    assert_history,
    delete_topic,
    end_offsets,
    mirrored_count,
    mirrored_history,
    new_topic,
    read_topic,
    topic_id_of,
    topics_of,
    wait_for,
    write,
)

FLOW = "east-to-aggregate"
FAST = {"topic.refresh.ms": "1000"}


def worker_doc(lab: MirrorLab) -> dict[str, Any]:
    """The single worker's last status file."""
    docs = list(lab.worker_status(FLOW).values())
    assert len(docs) == 1, docs
    return docs[0]


def events(lab: MirrorLab, kind: str) -> list[dict[str, Any]]:
    return [e for e in worker_doc(lab).get("events", []) if e["kind"] == kind]


def want_of(incarnations: list[tuple[str, dict[int, list[Rec]]]], partition: int) -> list[tuple[str, Rec]]:
    return [(tid, r) for tid, rows in incarnations for r in rows.get(partition, [])]


@pytest.mark.timeout(300)
def test_a_source_topic_created_again_is_mirrored_after_the_old_one_through_a_worker_kill(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "aggregate": 1})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    new_topic(east, "events", 2)
    write(east, "events", 2, 750, "first")
    lab.write_topology([Flow("east", "aggregate", "events", config=FAST)])
    lab.start_worker(FLOW, 0)
    lab.check_exactly_once(FLOW, ["events"], timeout_s=90)
    old_rows, old_id = read_topic(east, "events"), topic_id_of(east, "events")

    # Deleted and created again: offsets from 0, below the mirror's last position (375).
    delete_topic(east, "events")
    new_topic(east, "events", 2)
    new_id = topic_id_of(east, "events")
    assert new_id != old_id
    write(east, "events", 2, 500, "second")
    wait_for(lambda: mirrored_count(aggregate, "east.events") == 1250, 60,
             "the aggregate holds the old 750 and the new 500 records", interval_s=0.5, on_timeout=lab.mirror_log_tail)
    target = read_topic(aggregate, "east.events")
    new_rows = read_topic(east, "events")
    for p in (0, 1):
        assert_history(mirrored_history(target[p]), want_of([(old_id, old_rows), (new_id, new_rows)], p),
                       f"east.events-{p} after the re-creation")
    assert "was deleted and created again" in lab.mirror_log(), lab.mirror_log_tail()
    wait_for(lambda: worker_doc(lab)["source_recreations"] >= 1, 10, "the re-creation counted in the status")
    recreated = events(lab, "source_recreated")
    assert {(e["partition"], e["new_topic_id"]) for e in recreated} >= {(0, str(_uuid(new_id))), (1, str(_uuid(new_id)))}

    # kill -9 in the middle of the new incarnation's traffic; the restarted worker resumes
    # from the aggregate's tail in the new incarnation.
    writer = SourceWriter(east, "events", 2, 3000, "third", rate_per_s=800, start=500).start()
    wait_for(lambda: mirrored_count(aggregate, "east.events") >= 1250 + 800, 60, "the mirror moves the third writes",
             interval_s=0.3, on_timeout=lab.mirror_log_tail)
    lab.kill_worker(FLOW, 0)
    killed_at = mirrored_count(aggregate, "east.events")
    lab.start_worker(FLOW, 0)
    writer.finish()
    ends = end_offsets(east, "events")
    assert sum(ends.values()) == 3500
    lab.wait_caught_up({FLOW: {("events", p): end for p, end in ends.items()}}, 120, count_mirrored=True)
    target = read_topic(aggregate, "east.events")
    new_rows = read_topic(east, "events")
    for p in (0, 1):
        assert_history(mirrored_history(target[p]), want_of([(old_id, old_rows), (new_id, new_rows)], p),
                       f"east.events-{p} after the kill")
    print(f"killed with {killed_at} of 4250 in the aggregate; all 750 + 3500 there once, in order", flush=True)


@pytest.mark.timeout(240)
def test_a_flow_told_to_stop_on_a_recreated_topic_stops_its_partitions(mirror_lab: Callable[..., MirrorLab]) -> None:
    """on.topic.recreated = stop: the new incarnation is not mirrored; its partition shows
    STOPPED with the reason, the re-creation is counted and nothing of it reaches the target."""
    lab = mirror_lab({"east": 1, "aggregate": 1})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    new_topic(east, "events", 1)
    write(east, "events", 1, 300, "first")
    lab.write_topology([Flow("east", "aggregate", "events", config={**FAST, "on.topic.recreated": "stop"})])
    lab.start_worker(FLOW, 0)
    lab.check_exactly_once(FLOW, ["events"], timeout_s=90)
    delete_topic(east, "events")
    new_topic(east, "events", 1)
    write(east, "events", 1, 100, "second")

    def stopped() -> bool:
        parts = worker_doc(lab)["partitions"]
        return bool(parts) and parts[0]["state"] == "STOPPED" and "on.topic.recreated = stop" in parts[0]["reason"]

    wait_for(stopped, 60, "events-0 STOPPED in the worker's status", on_timeout=lab.mirror_log_tail)
    assert worker_doc(lab)["source_recreations"] == 1
    assert mirrored_count(aggregate, "east.events") == 300, "records of the new incarnation were mirrored"
    text = subprocess.run([sys.executable, "-m", "deploy.cli", "mirror", "status", "--config", str(lab.topology_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    assert "events-0 lag" in text and "STOPPED" in text and "1 source topic re-creation(s)" in text, text


def warehouse_rows(warehouse: Path, table: str) -> list[dict[str, Any]]:
    """The rows of a warehouse table, from its committed Parquet files (not the staging area)."""
    import pyarrow.parquet as pq

    files = [f for f in warehouse.rglob("*.parquet") if table in f.parts and "_staging" not in f.parts]
    assert files, f"no Parquet files of {table} under {warehouse}"
    return [row for f in sorted(files) for row in pq.read_table(f).to_pylist()]


def _uuid(text: str) -> Any:
    from mirror.history import parse_topic_id

    return parse_topic_id(text)


# ---------------------------------------------------------------- unclean election at the source


def produce_values(bootstrap: str, topic: str, values: list[int]) -> list[int]:
    """One record per value into partition 0 (idempotent, acks=all); their offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 30_000, "log_level": 2})
    offsets: dict[int, int] = {}
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets[int(msg.value())] = msg.offset()

    for v in values:
        producer.produce(topic, value=str(v).encode(), key=b"k%d" % v, partition=0, on_delivery=delivered)
    assert producer.flush(40) == 0 and not errors, errors
    return [offsets[v] for v in values]


def wait_partition(lab: MirrorLab, node: int, topic: str, leader: int | None, isr: set[int],
                   timeout_s: float = 40) -> None:
    """Until node `node` reports `topic`-0 led by `leader` (None: any live leader) with ISR `isr`."""
    def reached() -> bool:
        view = partitions_of(metadata_from(lab["east"], node, topic), topic)[0]
        if (view.leader < 0 if leader is None else view.leader != leader) or set(view.isr) != isr:
            raise NotYet(view)
        return True

    wait_for(reached, timeout_s, f"node {node} reports {topic}-0 led by {leader} with ISR {sorted(isr)}")


def node_views(lab: MirrorLab, topic: str) -> str:
    """What each live east broker answers about `topic`-0 (leader, ISR), for a timeout's report."""
    views = []
    for node, broker in lab["east"].brokers.items():
        if broker.proc is None or broker.proc.poll() is not None:
            continue
        try:
            view = partitions_of(metadata_from(lab["east"], node, topic), topic)[0]
            views.append(f"node {node}: leader {view.leader}, ISR {sorted(view.isr)}")
        except (NotYet, KeyError, OSError) as exc:
            views.append(f"node {node}: {exc}")
    return "; ".join(views)


@pytest.mark.timeout(600)
def test_an_unclean_election_at_the_source_is_a_reported_divergence_and_the_new_records_arrive(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    """Broker 2 is killed; broker 1 acknowledges 50 records alone (min.insync.replicas=1) and
    the mirror copies them; broker 1 is killed; broker 2 comes back and is made leader by an
    unclean election: it lacks offsets 200..249. It takes 80 new records at 200..279. The
    aggregate keeps the 50 (epoch 0) and reports them as a divergence [200, 249]; the 80 new
    ones follow them, once each (in the new leader's epoch)."""
    began = time.monotonic()
    lab = mirror_lab({"east": 3, "aggregate": 1}, controllers={"east": 3})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    client = admin(east)
    client.create_topics([NewTopic("events", 1, replica_assignment=[[1, 2]],
                                   config={"min.insync.replicas": "1"})])["events"].result(timeout=30)
    wait_partition(lab, 1, "events", 1, {1, 2})
    assert produce_values(east, "events", list(range(200))) == list(range(200))
    lab.write_topology([Flow("east", "aggregate", "events", config=FAST)], replication_factor=1)
    lab.start_worker(FLOW, 0)
    wait_for(lambda: mirrored_count(aggregate, "east.events") == 200, 60, "200 records mirrored",
             on_timeout=lab.mirror_log_tail)
    tid = topic_id_of(east, "events")

    lab["east"][2].kill9()
    wait_partition(lab, 1, "events", 1, {1})
    assert produce_values(lab["east"].bootstrap_of(1), "events", list(range(10_000, 10_050))) == list(range(200, 250))
    wait_for(lambda: mirrored_count(aggregate, "east.events") == 250, 60, "the 50 records broker 1 took alone "
             "mirrored", on_timeout=lab.mirror_log_tail)
    diverged_rows = read_topic(lab["east"].bootstrap_of(1), "events")[0][200:]
    lab["east"][1].kill9()
    lab["east"][2].start()
    # ELR on (KIP-966, every new cluster): broker 1, the last ISR member, left the ISR for the
    # ELR when it was fenced; broker 2 is neither, so nothing is elected without asking.
    wait_partition(lab, 2, "events", -1, set())
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", "elect-leaders", "--election-type", "unclean",
                           "--topic", "events", "--partition", "0", "--bootstrap", lab["east"].bootstrap_of(2)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_partition(lab, 2, "events", 2, {2})
    assert produce_values(lab["east"].bootstrap_of(2), "events", list(range(20_000, 20_080))) == list(range(200, 280))

    wait_for(lambda: mirrored_count(aggregate, "east.events") == 330, 60,
             "the aggregate holds 200 + 50 diverged + 80 new records", interval_s=0.5,
             on_timeout=lambda: f"{lab.mirror_log_tail()}\nworker status: {worker_doc(lab)['partitions']}\n"
                                f"{node_views(lab, 'events')}")
    source = read_topic(lab["east"].bootstrap_of(2), "events")[0]
    assert [int(r.value or b"") for r in source] == list(range(200)) + list(range(20_000, 20_080))
    target = mirrored_history(read_topic(aggregate, "east.events")[0])
    assert_history(target, [(tid, r) for r in source[:200] + diverged_rows + source[200:]], "east.events-0")
    # The source's epochs, as its leaders wrote them (a busy machine may move the leader more
    # often): never decreasing in what was mirrored first, one later epoch for the new records.
    old_epochs, new_epochs = [m.epoch for m in target[:250]], {m.epoch for m in target[250:]}
    (new_epoch,) = new_epochs
    assert old_epochs == sorted(old_epochs) and old_epochs[-1] < new_epoch, \
        f"leader epochs in the provenance: {sorted(set(old_epochs))} then {sorted(new_epochs)}"
    log_text = lab.mirror_log()
    assert "DIVERGED: east/events-0 no longer holds source offsets 200..249" in log_text, lab.mirror_log_tail()
    wait_for(lambda: worker_doc(lab)["diverged_records"] == 50, 10, "50 diverged offsets in the status")
    (event,) = events(lab, "diverged")
    assert (event["start_offset"], event["end_offset"], event["offsets"], event["mirrored_epoch"]) == \
        (200, 249, 50, old_epochs[-1])

    # The old leader comes back and truncates its tail: the source is whole again, nothing more
    # is mirrored.
    lab["east"][1].start()
    wait_partition(lab, 2, "events", 2, {1, 2})
    assert mirrored_count(aggregate, "east.events") == 330

    # Then the topic is deleted and created again: a third history of offsets 0.., mirrored
    # after the other two.
    delete_topic(east, "events")
    client.create_topics([NewTopic("events", 1, replica_assignment=[[1, 2]])])["events"].result(timeout=30)
    wait_partition(lab, 1, "events", None, {1, 2})
    new_tid = topic_id_of(east, "events")
    assert produce_values(east, "events", list(range(30_000, 30_060))) == list(range(60))
    wait_for(lambda: mirrored_count(aggregate, "east.events") == 390, 60, "the new incarnation's 60 records",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)

    # The warehouse after both: every row once, none merged, told apart by topic id and epoch.
    print(f"divergence reported and the new incarnation mirrored after {time.monotonic() - began:.0f} s; loading",
          flush=True)
    warehouse = lab.root / "warehouse"
    with open(lab.topology_path, "a") as f:
        f.write(f'\n[warehouse]\nsource = "aggregate"\npath = "{warehouse}"\ntopics = "east\\\\..*"\n')
    load = subprocess.run([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "load", "--config",
                           str(lab.topology_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert load.returncode == 0, f"dcmirror load: {load.stdout[-2000:]}\n{load.stderr[-3000:]}"
    rows = warehouse_rows(warehouse, "east_events")
    keys = [(r["source_topic_id"], r["source_leader_epoch"], r["source_offset"]) for r in rows]
    assert len(rows) == 390 and len(set(keys)) == 390, f"{len(rows)} rows, {len(set(keys))} distinct identities"
    assert len({(r["source_partition"], r["source_offset"]) for r in rows}) == 280, \
        "(partition, offset) alone would merge the three histories"
    counted = {(tid_, epoch): 0 for tid_, epoch, _ in keys}
    for tid_, epoch, _ in keys:
        counted[tid_, epoch] += 1
    want: dict[tuple[Any, int], int] = {}
    for m in [*target, *mirrored_history(read_topic(aggregate, "east.events")[0])[330:]]:
        want[m.topic_id, m.epoch] = want.get((m.topic_id, m.epoch), 0) + 1
    assert counted == want and want[tid, new_epoch] == 80 and sum(n for (t, _), n in want.items() if t == new_tid) == 60, \
        (counted, want)


# ---------------------------------------------------------------- the aggregate topic deleted


@pytest.mark.timeout(300)
def test_an_aggregate_topic_deleted_under_a_running_flow_is_refilled_from_the_source(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "aggregate": 1})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    new_topic(east, "events", 2)
    write(east, "events", 2, 1000, "first")
    lab.write_topology([Flow("east", "aggregate", "events", config=FAST)])
    lab.start_worker(FLOW, 0)
    lab.check_exactly_once(FLOW, ["events"], timeout_s=90)
    writer = SourceWriter(east, "events", 2, 2000, "second", rate_per_s=500, start=1000).start()
    wait_for(lambda: mirrored_count(aggregate, "east.events") >= 1200, 60, "the mirror moves the writes")
    old_target_id = topic_id_of(aggregate, "east.events")
    client = admin(aggregate)
    client.delete_topics(["east.events"], operation_timeout=30)["east.events"].result(timeout=30)
    # The flow creates it again at once (topic.refresh.ms 1000): a new topic id, not a wait.
    wait_for(lambda: "east.events" in topics_of(aggregate) and topic_id_of(aggregate, "east.events") != old_target_id,
             30, "east.events created again", interval_s=0.2)
    writer.finish()
    ends = end_offsets(east, "events")
    assert sum(ends.values()) == 3000
    lab.wait_caught_up({FLOW: {("events", p): end for p, end in ends.items()}}, 120, count_mirrored=True)
    source = read_topic(east, "events")
    target = read_topic(aggregate, "east.events")
    tid = topic_id_of(east, "events")
    for p in (0, 1):
        got = mirrored_history(target[p])
        want = [(tid, r) for r in source[p]]
        if [m.offset for m in got] != [r.offset for _, r in want]:
            # Records retried into the new topic before the flow saw it gone come first, then
            # the hole below them is filled: each once, in two ordered runs.
            assert sorted(m.offset for m in got) == [r.offset for _, r in want], f"partition {p}: not each once"
            runs = 1 + sum(1 for a, b in zip(got, got[1:], strict=False) if b.offset < a.offset)
            assert runs <= 3, f"partition {p}: {runs} runs of source offsets"
        else:
            assert_history(got, want, f"east.events-{p}")
    assert "lost records mirrored from east/events" in lab.mirror_log(), lab.mirror_log_tail()
    wait_for(lambda: worker_doc(lab)["target_refills"] >= 2, 10, "both partitions' refills in the status")



def test_a_target_holding_only_the_later_records_has_the_hole_below_filled_once(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    """A target partition that starts (log start 0) with source offsets 60..99 of the source's
    current incarnation — what retried writes leave in a re-created target before the flow
    refills it — is claimed: the claim finds the hole 0..59 below (asked of all partitions
    at once), copies it, then goes on after 99. Each source record once; partition 1, whose
    target holds nothing, is copied from 0 in order."""
    lab = mirror_lab({"east": 1, "aggregate": 1})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    new_topic(east, "events", 2)
    write(east, "events", 2, 200, "held")
    new_topic(aggregate, "east.events", 2)
    tid = topic_id_of(east, "events")
    source = read_topic(east, "events")
    assert [r.offset for r in source[0]] == list(range(100))
    producer = Producer({"bootstrap.servers": aggregate, "enable.idempotence": True})
    for r in source[0][60:]:
        producer.produce("east.events", key=r.key, value=r.value, partition=0,
                         headers=list(provenance.mirrored_headers((), "east", 0, r.offset, tid)))
    assert producer.flush(30) == 0
    lab.write_topology([Flow("east", "aggregate", "events", config=FAST)])
    lab.start_worker(FLOW, 0)
    lab.wait_caught_up({FLOW: {("events", 0): 100, ("events", 1): 100}}, 90, count_mirrored=True)
    target = read_topic(aggregate, "east.events")
    got = mirrored_history(target[0])
    assert [m.offset for m in got] == list(range(60, 100)) + list(range(60)), [m.offset for m in got]
    assert [(m.key, m.value) for m in got] == [(r.key, r.value) for r in source[0][60:] + source[0][:60]]
    assert_history(mirrored_history(target[1]), [(tid, r) for r in source[1]], "east.events-1")
    said = lab.mirror_log()
    assert "holds source offsets 60..99 but not 0..59; refilling from source offset 0" in said, lab.mirror_log_tail()
