"""[warehouse.registry_schemas]: typed warehouse tables from the schema registry (issue 33)."""

from __future__ import annotations

import pytest

from tests.unit.test_topology import TWO_CLUSTERS, err, line, ok
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
