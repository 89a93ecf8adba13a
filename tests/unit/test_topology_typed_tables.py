"""[warehouse.registry_schemas]: typed warehouse tables from the schema registry (issue 33)."""

from __future__ import annotations

import pytest

from tests.unit.test_topology import TWO_CLUSTERS, WEST, err, line, ok
from topology.model import RegistryTableSpec

REGISTRY = '\n[clusters.aggregate.registry]\nlisten = "127.0.0.1:38081"\n'
WAREHOUSE = '\n[warehouse]\nsource = "aggregate"\n\n[warehouse.registry_schemas]\n'


def test_entries_with_defaults_strategy_subject_and_poison() -> None:
    topo = ok(TWO_CLUSTERS + REGISTRY + WAREHOUSE
              + '"east[.]orders" = { value = true }\n'
              + '"east[.]refunds" = { subject_name_strategy = "RecordNameStrategy", subject = "shop.Refund", '
                'poison = "fail" }\n'
              + '"east[.]carts" = { key = true, key_subject = "cart-key" }\n')
    assert topo.warehouse is not None
    assert topo.warehouse.registry_schemas == (
        RegistryTableSpec("east[.]orders"),
        RegistryTableSpec("east[.]refunds", subject_name_strategy="RecordNameStrategy", subject="shop.Refund",
                          poison="fail"),
        RegistryTableSpec("east[.]carts", key=True, key_subject="cart-key"))


@pytest.mark.parametrize(("entry", "key", "problem"), [
    ('{ value = true }', "", "has none: add [clusters.aggregate.registry]"),
    ('{ key_subject = "k" }', '."east[.]orders".' "key_subject", "but key is not true"),
    ('{ key = true, key_subject = 3 }', '."east[.]orders".' "key_subject", "takes a subject name"),
    ('{ value = "yes" }', '."east[.]orders".' "value", "takes true or false"),
    ('{ subject_name_strategy = "TopicNameStrateg" }', '."east[.]orders".' "subject_name_strategy",
     "(did you mean 'TopicNameStrategy'?)"),
    ('{ subject_name_strategy = "RecordNameStrategy" }', '."east[.]orders".' "subject", "name the subject"),
    ('{ poison = "drop" }', '."east[.]orders".' "poison", "takes one of dead-letter, fail, not 'drop'"),
    ('{ valu = true }', '."east[.]orders".' "valu", "(did you mean 'value'?)"),
])
def test_bad_entries_are_refused_naming_the_key(entry: str, key: str, problem: str) -> None:
    registry = "" if "has none" in problem else REGISTRY
    text = TWO_CLUSTERS + registry + WAREHOUSE + f'"east[.]orders" = {entry}\n'
    exc = err(text)
    assert exc.key_path == "warehouse.registry_schemas" + key, str(exc)
    assert problem in exc.problem, str(exc)
    assert exc.line is not None and exc.line >= line(text, "[warehouse.registry_schemas]")


def test_the_default_topology_documents_registry_schemas() -> None:
    from topology import default_topology_text

    assert "registry_schemas  optional table of topic regex -> typed table" in default_topology_text()


def test_the_loaders_registry_credentials_are_references_only() -> None:
    config = '\n[warehouse.config]\n"registry.basic.auth.user.info" = '
    text = TWO_CLUSTERS + REGISTRY + '\n[warehouse]\nsource = "aggregate"\n' + config + '"alice:hunter2"\n'
    exc = err(text)
    assert exc.key_path == 'warehouse.config."registry.basic.auth.user.info"', str(exc)
    assert "never the secret itself" in exc.problem and "hunter2" not in str(exc)
    topo = ok(TWO_CLUSTERS + REGISTRY + '\n[warehouse]\nsource = "aggregate"\n' + config + '"${env:REG_USER}"\n')
    assert topo.warehouse is not None
    assert topo.warehouse.config["registry.basic.auth.user.info"] == "${env:REG_USER}"


EAST_REGISTRY = '\n[clusters.east.registry]\nlisten = "127.0.0.1:18081"\n'


def flows_topology(flow: str) -> str:
    return (TWO_CLUSTERS + WEST + EAST_REGISTRY + REGISTRY + '\n[clusters.west.registry]\nlisten = "127.0.0.1:28081"\n'
            + flow + WAREHOUSE + '"from_.*" = { value = true }\n')


def test_typed_tables_read_the_flows_schema_context_and_rename() -> None:
    """Issue 43 (6): a flow's `schema_context` and `rename` decide where a typed table looks
    for the subject and the schema ids of that source's records."""
    from spark_aggregate.settings import WarehouseSettings
    from spark_aggregate.typed import context_of, subject_candidates

    topo = ok(flows_topology(
        '\n[[mirrors]]\nsource = "east"\ntarget = "aggregate"\ntopics = "orders|carts"\nschemas = true\n'
        'schema_context = ".emea"\nrename = "from_{source}_{topic}"\n'
        '\n[[mirrors]]\nsource = "west"\ntarget = "aggregate"\ntopics = ".*"\nschemas = true\n'))
    settings = WarehouseSettings.from_topology(topo)
    assert topo.schema_contexts("aggregate") == (("east", ".emea"), ("west", ".west"))
    sources = settings.schema_sources("from_east_orders")
    assert sources == (("east", ".emea", "orders"), ("west", ".west", None))
    assert subject_candidates("from_east_orders", ".emea", "", "value", sources) == [
        "from_east_orders-value", "orders-value"]
    assert subject_candidates("from_east_orders", ".emea", "", "key", sources) == [
        "from_east_orders-key", "orders-key"]
    # A topic the flow does not copy (rename matches, topics does not): no source subject.
    assert settings.schema_sources("from_east_refunds")[0] == ("east", ".emea", None)
    assert subject_candidates("from_east_refunds", ".emea", "", "value",
                              settings.schema_sources("from_east_refunds")) == ["from_east_refunds-value"]
    # The default rename and context, and a context no flow names (the prefix rule).
    assert settings.schema_sources("west.orders")[1] == ("west", ".west", "orders")
    assert subject_candidates("central.orders", ".central", "") == ["central.orders-value", "orders-value"]
    contexts = tuple((c, x) for c, x, _ in sources)
    assert context_of("east", "aggregate", contexts) == ".emea"
    assert context_of("west", "aggregate", contexts) == ".west"
    assert context_of("south", "aggregate", contexts) == ".south"
    assert context_of("aggregate", "aggregate", contexts) == "" and context_of(None, "aggregate", contexts) == ""


@pytest.mark.parametrize(("rename", "target", "source_topic"), [
    ("{source}.{topic}", "east.orders", "orders"),
    ("{source}.{topic}", "east.a.b", "a.b"),
    ("{topic}", "orders", "orders"),
    ("{topic}-{source_dc}-copy", "orders-east-copy", "orders"),
    ("{topic}-{source_dc}-copy", "orders-west-copy", None),
    ("{source}.{topic}", "west.orders", None),
    ("{target}_{topic}_{topic}", "aggregate_x_x", "x"),
    ("{target}_{topic}_{topic}", "aggregate_x_y", None),
    ("{target}_{topic}_{topic}", "aggregate_a_b_a_b", "a_b"),
    ("a.{topic}", "a.b", "b"),
    ("a.{topic}", "axb", None),
])
def test_a_rename_template_read_backwards(rename: str, target: str, source_topic: str | None) -> None:
    from topology.model import MirrorSpec

    flow = next(m for m in ok(TWO_CLUSTERS + f'\n[[mirrors]]\nsource = "east"\ntarget = "aggregate"\n'
                                               f'topics = ".*"\nrename = "{rename}"\n').mirrors)
    assert isinstance(flow, MirrorSpec)
    assert flow.source_topic(target, "east") == source_topic
