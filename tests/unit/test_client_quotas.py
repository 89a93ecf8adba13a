"""The client quota core (cluster/broker/quotas.py): Kafka's rate, throttle times, precedence,
validation and describe filters; the ClientQuota records of the metadata image and the
controller's alter_client_quotas. Throttle times are exact: with a bound of B bytes/s and
a measured span of W ms, Kafka's (O - B) / B * W is total * 1000 / B - W."""

from __future__ import annotations

import random

import pytest

from cluster.broker.quotas import (
    CONSUMER_BYTE_RATE,
    ENTITY_CLIENT_ID,
    ENTITY_USER,
    MATCH_DEFAULT,
    MATCH_EXACT,
    MATCH_SPECIFIED,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotaManager,
    ClientQuotas,
    QuotaRequestError,
    QuotaWindow,
    SampledRate,
    entity_key,
    entity_path,
    parse_filter,
    validate_entity,
    validate_value,
)
from cluster.controller.controller import ControllerConfig, QuorumController
from cluster.controller.image import MetadataImage, record

U, C = ENTITY_USER, ENTITY_CLIENT_ID


def produce_manager(quotas: dict[tuple[tuple[str, str | None], ...], float]) -> ClientQuotaManager:
    m = ClientQuotaManager("produce")
    m.update({entity_key(e): {PRODUCER_BYTE_RATE: v} for e, v in quotas.items()})
    return m


def test_rate_spans_at_least_ten_windows_then_the_oldest_sample() -> None:
    r = SampledRate(QuotaWindow())
    r.record(5000, 0)
    assert r.window_ms(0) == 10_000 and r.rate(0) == 500.0
    assert r.window_ms(2500) == 12_500 - 2000  # two whole windows elapsed: 2500 + 8 windows
    for t in range(1000, 12_000, 1000):
        r.record(0, t)
    assert r.window_ms(10_500) == 10_500  # ten whole windows since the first sample
    # The first sample (events at 0 only) expires 11 windows after its last event.
    assert r.total(10_999) == 5000 and r.total(11_000) == 0


def test_exact_throttle_times() -> None:
    m = produce_manager({((C, "c"),): 1000})
    assert m.record("ANONYMOUS", "c", 10_000, 0) == 0  # 10 000 B over 10 s: exactly the bound
    assert m.record("ANONYMOUS", "c", 1, 0) == 1  # 10 001 - 10 000
    assert m.record("ANONYMOUS", "c", 5000, 500) == 15_001 - 10_500
    # Another client id has no quota at all.
    assert m.record("ANONYMOUS", "other", 10**9, 500) == 0


def test_a_burst_in_the_first_windows_is_paid_until_it_expires() -> None:
    # Kafka's span is padded to ten windows until ten have passed, so the throttle formula's
    # assumption (the span grows by the delay) does not hold yet: the burst keeps the client
    # throttled until its sample expires, eleven windows after its last event.
    m = produce_manager({((C, "c"),): 1000})
    assert m.record("ANONYMOUS", "c", 20_000, 0) == 10_000
    assert m.record("ANONYMOUS", "c", 0, 10_000) == 10_000  # span still 10 s: 20 000 - 10 000
    assert m.record("ANONYMOUS", "c", 0, 10_999) == 20_000 - 10_999
    r = produce_manager({((C, "c"),): 1000})
    r.record("ANONYMOUS", "c", 20_000, 0)
    assert r.record("ANONYMOUS", "c", 1000, 5000) == 21_000 - 10_000


def test_idle_samples_expire() -> None:
    m = produce_manager({((C, "c"),): 1000})
    assert m.record("ANONYMOUS", "c", 20_000, 0) == 10_000
    assert m.record("ANONYMOUS", "c", 100, 11_000) == 0  # the 20 000 B sample is gone


def test_quota_precedence_as_kafka() -> None:
    levels = [
        ((U, "alice"), (C, "app")),
        ((U, "alice"), (C, None)),
        ((U, "alice"),),
        ((U, None), (C, "app")),
        ((U, None), (C, None)),
        ((U, None),),
        ((C, "app"),),
        ((C, None),),
    ]
    quotas = {entity_key(e): 100.0 * (i + 1) for i, e in enumerate(levels)}
    for i in range(len(levels)):
        m = produce_manager(quotas)
        assert m.quota_limit("alice", "app") == 100.0 * (i + 1), levels[i]
        del quotas[entity_key(levels[i])]
    assert produce_manager(quotas).quota_limit("alice", "app") is None


def test_defaults_apply_to_anyone_not_named() -> None:
    m = produce_manager({((U, None),): 500, ((U, "bob"),): 900, ((C, None),): 50})
    assert m.quota_limit("alice", "x") == 500
    assert m.quota_limit("bob", "x") == 900
    m = produce_manager({((C, None),): 50, ((C, "fast"),): 5000})
    assert m.quota_limit("ANONYMOUS", "slow") == 50
    assert m.quota_limit("ANONYMOUS", "fast") == 5000


def test_a_user_quota_is_shared_by_its_client_ids_a_default_client_quota_is_not() -> None:
    m = produce_manager({((U, "alice"),): 1000})
    assert m.record("alice", "c1", 6000, 0) == 0
    assert m.record("alice", "c2", 6000, 0) == 2000  # one sensor for alice: 12 000 - 10 000
    m = produce_manager({((C, None),): 1000})
    assert m.record("alice", "c1", 6000, 0) == 0
    assert m.record("alice", "c2", 6000, 0) == 0  # a sensor per client id


def test_fetch_unrecord_and_largest_fetch() -> None:
    m = ClientQuotaManager("fetch")
    m.update({entity_key([(C, "c")]): {CONSUMER_BYTE_RATE: 1000.0}})
    assert m.max_value_in_window("ANONYMOUS", "c") == 10_000
    assert m.max_value_in_window("ANONYMOUS", "free") == float("inf")
    assert m.record("ANONYMOUS", "c", 12_000, 0) == 2000
    m.unrecord("ANONYMOUS", "c", 12_000, 0)  # the answer was empty: nothing was fetched
    assert m.record("ANONYMOUS", "c", 10_000, 0) == 0


def test_request_time_throttle_is_capped_at_one_window() -> None:
    m = ClientQuotaManager("request", max_throttle_time_ms=1000)
    m.update({entity_key([(C, "c")]): {REQUEST_PERCENTAGE: 10.0}})
    assert m.record("ANONYMOUS", "c", 100.0, 0) == 0  # 1 s of handler time over 10 s: 10 %
    assert m.record("ANONYMOUS", "c", 400.0, 0) == 1000  # (50 - 10) / 10 * 10 s, capped


def test_without_quotas_nothing_is_kept() -> None:
    m = produce_manager({})
    assert not m.enabled
    for i in range(100):
        assert m.record("u", f"c{i}", 10**9, 0) == 0
    assert m._sensors == {}


def test_sensors_are_bounded() -> None:
    m = ClientQuotaManager("produce", max_sensors=10)
    m.update({entity_key([(C, None)]): {PRODUCER_BYTE_RATE: 1000.0}})
    for i in range(50):
        m.record("u", f"c{i}", 1, i)
    assert len(m._sensors) == 10


def test_alter_validation_messages() -> None:
    def refused(pairs: list[tuple[str, str | None]]) -> str:
        with pytest.raises(QuotaRequestError) as e:
            validate_entity(pairs)
        assert e.value.code == 42
        return e.value.message

    assert refused([]) == "Invalid empty client quota entity"
    assert refused([(U, "a"), (U, "b")]) == "Invalid empty client quota entity, duplicate entity entry user"
    assert refused([("group", "g")]) == "Unhandled client quota entity type: group"
    assert refused([(C, "")]) == "Empty client-id not supported"
    assert "not supported" in refused([("ip", "1.2.3.4")])
    assert validate_entity([(U, "a"), (C, None)]) == ((C, None), (U, "a"))
    assert entity_path(((C, None), (U, "a"))) == "/config/users/a/clients/<default>"

    def bad_value(key: str, value: float) -> str:
        with pytest.raises(QuotaRequestError) as e:
            validate_value(key, value)
        assert e.value.code == 42
        return e.value.message

    assert bad_value("producer_byte_rate", 1.5) == "Configuration producer_byte_rate must be a Long value"
    assert bad_value("consumer_bytes_rate", 1) == "Invalid configuration key consumer_bytes_rate"
    assert "must be greater than 0" in bad_value("request_percentage", 0)
    assert "not enforced" in bad_value("controller_mutation_rate", 10)
    validate_value("request_percentage", 12.5)
    validate_value("producer_byte_rate", 1048576.0)


def test_describe_filters_as_kafka() -> None:
    entities = [((U, "alice"),), ((U, None),), ((C, "app"), (U, "alice")), ((C, None),), ((C, "app"),)]

    def match(components: list[tuple[str, int, str | None]], strict: bool = False) -> list[object]:
        f = parse_filter(components, strict)
        return [e for e in entities if f.matches(e)]

    assert match([(U, MATCH_EXACT, "alice")]) == [((U, "alice"),), ((C, "app"), (U, "alice"))]
    assert match([(U, MATCH_EXACT, "alice")], strict=True) == [((U, "alice"),)]
    assert match([(U, MATCH_DEFAULT, None)]) == [((U, None),)]
    assert match([(C, MATCH_SPECIFIED, None)], strict=True) == [((C, None),), ((C, "app"),)]
    assert match([], strict=False) == entities
    for components, message in (
            ([(U, MATCH_EXACT, None)], "Request specified MATCH_TYPE_EXACT, but set match string to null."),
            ([(U, MATCH_DEFAULT, "x")], "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
            ([(U, MATCH_EXACT, "a"), (U, MATCH_SPECIFIED, None)],
             "Entity type user cannot appear more than once in the filter."),
            ([("", MATCH_EXACT, "a")], "Invalid empty entity type.")):
        with pytest.raises(QuotaRequestError) as e:
            parse_filter(components, False)
        assert (e.value.code, e.value.message) == (42, message)
    with pytest.raises(QuotaRequestError) as e:
        parse_filter([("topic", MATCH_EXACT, "t")], False)
    assert e.value.code == 35


def test_broker_takes_new_quotas_by_version_and_by_image() -> None:
    quotas = ClientQuotas()
    first = {entity_key([(C, "c")]): {PRODUCER_BYTE_RATE: 1000.0}}
    quotas.update(first, 1)
    assert quotas.produce.quota_limit("u", "c") == 1000.0
    # A snapshot load replaces the image: the same version number may hold other quotas.
    quotas.update({entity_key([(C, "c")]): {PRODUCER_BYTE_RATE: 5.0}}, 1)
    assert quotas.produce.quota_limit("u", "c") == 5.0
    assert not quotas.fetch.enabled and not quotas.request.enabled


def test_image_records_and_snapshot() -> None:
    image = MetadataImage()
    image.apply(record("ClientQuota", entity=[[U, "alice"], [C, None]], key=PRODUCER_BYTE_RATE, value=1000.0))
    image.apply(record("ClientQuota", entity=[[C, "app"]], key=CONSUMER_BYTE_RATE, value=2000.0))
    assert image.client_quotas == {((C, None), (U, "alice")): {PRODUCER_BYTE_RATE: 1000.0},
                                   ((C, "app"),): {CONSUMER_BYTE_RATE: 2000.0}}
    assert not image.is_empty
    again = MetadataImage.from_bytes(image.to_bytes())
    assert again.client_quotas == image.client_quotas
    image.apply(record("ClientQuota", entity=[[C, "app"]], key=CONSUMER_BYTE_RATE, value=None))
    assert ((C, "app"),) not in image.client_quotas


def test_controller_emits_only_changes() -> None:
    ctrl = QuorumController(MetadataImage(), ControllerConfig(), lambda c: None, random.Random(1), 0)
    entry = {"entity": [[C, "app"]], "ops": [[PRODUCER_BYTE_RATE, 1000.0], [CONSUMER_BYTE_RATE, None]]}
    assert ctrl.alter_client_quotas({"entries": [entry], "validate_only": True})["results"][0]["error_code"] == 0
    assert ctrl.take_records() == []
    ctrl.alter_client_quotas({"entries": [entry]})
    assert [(r["key"], r["value"]) for r in ctrl.take_records()] == [(PRODUCER_BYTE_RATE, 1000.0)]
    ctrl.alter_client_quotas({"entries": [entry]})
    assert ctrl.take_records() == []  # the same value again changes nothing
    ctrl.alter_client_quotas({"entries": [{"entity": [[C, "app"]], "ops": [[PRODUCER_BYTE_RATE, None]]}]})
    assert [(r["key"], r["value"]) for r in ctrl.take_records()] == [(PRODUCER_BYTE_RATE, None)]
    assert ctrl.image.client_quotas == {}
    full = ctrl.alter_client_quotas({"entries": [entry], "max_entities": 0})["results"][0]
    assert full["error_code"] == 44 and "limit" in full["error_message"]
