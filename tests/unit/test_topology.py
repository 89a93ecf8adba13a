"""Topology file loading and validation (topology/) and `dcmirror topology check`."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from deploy import topology_cmd
from deploy.dev_secrets import dev_secrets
from topology import (
    ClusterSpec,
    Defaults,
    MirrorSpec,
    NodeAddress,
    TopicSpec,
    Topology,
    TopologyError,
    WarehouseSpec,
    default_topology_text,
    format_key_path,
    load,
    load_default,
    loads,
)

FILE = Path("conf/topo.toml")

TWO_CLUSTERS = """\
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092", "127.0.0.1:19093", "127.0.0.1:19094"]

[clusters.aggregate]
datacenter = "central"
brokers = ["127.0.0.1:39092", "127.0.0.1:39093", "127.0.0.1:39094"]
"""

WEST = """
[clusters.west]
datacenter = "west"
brokers = ["127.0.0.1:29092"]
"""


def ok(text: str, base_dir: Path | None = Path("/base")) -> Topology:
    return loads(text, path=FILE, base_dir=base_dir)


def err(text: str) -> TopologyError:
    with pytest.raises(TopologyError) as info:
        loads(text, path=FILE, base_dir=Path("/base"))
    return info.value


def line(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line of the nth line containing ``needle``."""
    hits = [n for n, content in enumerate(text.splitlines(), 1) if needle in content]
    assert len(hits) >= occurrence, f"{needle!r} not in text"
    return hits[occurrence - 1]


def assert_error(exc: TopologyError, key_path: str, line_no: int | None, problem: str) -> None:
    """The whole message, exactly."""
    where = f"{FILE}:{line_no}" if line_no is not None else f"{FILE}"
    assert str(exc) == f"{where}: {key_path}: {problem}"
    assert (exc.file, exc.line, exc.key_path, exc.problem) == (str(FILE), line_no, key_path, problem)


def addrs(nodes: tuple[NodeAddress, ...]) -> list[tuple[int, str]]:
    return [(n.node_id, str(n)) for n in nodes]


# -- the embedded default topology ---------------------------------------------------------


def test_default_topology_loads_with_expected_nodes(tmp_path: Path) -> None:
    topo = load_default(base_dir=tmp_path)
    assert topo.path is None
    assert list(topo.clusters) == ["east", "west", "aggregate"]
    expected = {
        "east": ("east", 19092),
        "west": ("west", 29092),
        "aggregate": ("central", 39092),
    }
    for name, (dc, port) in expected.items():
        c = topo.cluster(name)
        assert c.name == name and c.datacenter == dc
        assert c.brokers == (
            NodeAddress(1, "127.0.0.1", port),
            NodeAddress(2, "127.0.0.1", port + 1),
            NodeAddress(3, "127.0.0.1", port + 2),
        )
        assert c.controllers == ()
        assert c.voters == c.brokers
        assert c.data_dir == tmp_path / "data" / name
        # secured: mutual TLS between brokers, SASL_SSL for clients, plaintext on loopback
        assert c.inter_broker_listener == "BROKER" and c.client_listener == "EXTERNAL"
        assert c.node_listeners(1) == (f"BROKER://127.0.0.1:{port},EXTERNAL://127.0.0.1:{port + 3},"
                                       f"LOCAL://127.0.0.1:{port + 6}")
        assert c.bootstrap() == ",".join(f"127.0.0.1:{port + 3 + i}" for i in range(3))
        assert c.config["ssl.keystore.location"] == str(tmp_path / "secrets" / "broker.pem")
        assert c.client["security.protocol"] == "SASL_SSL"
        assert c.users == {u: f"${{file:{tmp_path}/secrets/passwords.properties:{u}}}" for u in ("admin", "mirror")}
    assert topo.topics == tuple(
        TopicSpec(cluster, name, 3 if name == "orders" else 6, 3, {"min.insync.replicas": "2"})
        for cluster in ("east", "west") for name in ("pageviews", "clicks", "orders")
    )
    # the whole product: a registry per cluster, the warehouse service, the console
    assert {n: c.registry.listen.port for n, c in topo.clusters.items() if c.registry} == {
        "east": 18081, "west": 28081, "aggregate": 38081}
    assert topo.console is not None and topo.console.listen == NodeAddress(0, "127.0.0.1", 18480)
    mirror_login = {f"{side}.{k}": v for side in ("source", "target") for k, v in (
        ("sasl.username", "mirror"), ("sasl.password", f"${{file:{tmp_path}/secrets/passwords.properties:mirror}}"))}
    assert topo.mirrors == (
        MirrorSpec("east-to-aggregate", "east", "aggregate", "pageviews|clicks|orders", None, "{source}.{topic}", 2, None,
                   mirror_login, (NodeAddress(0, "127.0.0.1", 19500), NodeAddress(1, "127.0.0.1", 19501)),
                   schemas=True, schema_context=".east"),
        MirrorSpec("west-to-aggregate", "west", "aggregate", "pageviews|clicks|orders", None, "{source}.{topic}", 2, None,
                   mirror_login, (NodeAddress(0, "127.0.0.1", 29500), NodeAddress(1, "127.0.0.1", 29501)),
                   schemas=True, schema_context=".west"),
    )
    assert topo.mirrors[0].http_address(1) == ("127.0.0.1", 19501)
    warehouse = topo.warehouse
    assert warehouse is not None
    assert (warehouse.source, warehouse.path, warehouse.topics, warehouse.config) == (
        "aggregate", tmp_path / "warehouse", ".*", {"load.service": "true"})
    assert [t.topics for t in warehouse.registry_schemas] == ["(east|west)[.]orders"]
    assert topo.defaults == Defaults(6, 3, {})


def test_default_topology_text_is_the_packaged_file() -> None:
    import topology

    shipped = Path(topology.__file__).parent / "default.toml"
    assert default_topology_text() == shipped.read_text(encoding="utf-8")
    assert default_topology_text().splitlines().count("[[topics]]") == 6


def test_default_topology_without_base_dir_resolves_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    topo = loads(default_topology_text(), check_files=False)
    assert topo.cluster("west").data_dir == tmp_path / "data" / "west"


def test_load_from_file_resolves_paths_against_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "t.toml").write_text(default_topology_text())
    dev_secrets(conf / "t.toml")  # the CA, certificates and passwords it references
    topo = load(conf / "t.toml")
    assert topo.path == conf / "t.toml"
    assert topo.cluster("east").data_dir == conf / "data" / "east"
    assert topo.cluster("east").node_data_dir(2) == conf / "data" / "east" / "node-2"
    assert topo.warehouse is not None and topo.warehouse.path == conf / "warehouse"
    # a relative path to the file: paths still resolve against its (absolute) directory
    monkeypatch.chdir(tmp_path)
    topo2 = load("conf/t.toml")
    assert topo2.path == Path("conf/t.toml")
    assert topo2.clusters == topo.clusters


# -- model ---------------------------------------------------------------------------------


def test_node_address_str() -> None:
    assert str(NodeAddress(1, "127.0.0.1", 9092)) == "127.0.0.1:9092"
    assert str(NodeAddress(1, "::1", 9092)) == "[::1]:9092"


def test_controllers_get_ids_after_brokers_and_are_the_voters() -> None:
    topo = ok("""\
[clusters.east]
datacenter = "east"
brokers = ["h1:9092", "h2:9092"]
controllers = ["c1:9093", "c2:9093", "c3:9093"]
""")
    c = topo.cluster("east")
    assert addrs(c.brokers) == [(1, "h1:9092"), (2, "h2:9092")]
    assert addrs(c.controllers) == [(3, "c1:9093"), (4, "c2:9093"), (5, "c3:9093")]
    assert c.voters == c.controllers
    assert c.node(4) == NodeAddress(4, "c2", 9093)
    assert c.is_controller(4) and not c.is_controller(2)
    assert c.node_data_dir(5) == Path("/base/data/east/node-5")
    assert c.bootstrap() == "h1:9092,h2:9092"


def test_racks_give_each_broker_its_rack_and_turn_on_rack_aware_reads() -> None:
    base = """\
[clusters.east]
datacenter = "east"
brokers = ["h1:9092", "h2:9092", "h3:9092"]
controllers = ["c1:9093"]
"""
    c = ok(base + 'racks = ["az-1", "az-2", "az-3"]\n').cluster("east")
    assert c.racks == ("az-1", "az-2", "az-3")
    assert c.broker_configs(2) == {"broker.rack": "az-2", "replica.selector.class":
                                   "org.apache.kafka.common.replica.RackAwareReplicaSelector"}
    assert c.broker_configs(4) == {}  # a dedicated controller hosts no replicas
    chosen = ok(base + 'racks = ["a", "b", "c"]\nconfig = { "replica.selector.class" = "" }\n').cluster("east")
    assert chosen.broker_configs(1) == {"broker.rack": "a", "replica.selector.class": ""}
    assert ok(base).cluster("east").broker_configs(1) == {}
    assert "lists 2 rack(s) for 3 broker(s)" in str(err(base + 'racks = ["a", "b"]\n'))
    assert "array of rack names" in str(err(base + "racks = [1, 2, 3]\n"))
    assert "rack name 'a b'" in str(err(base + 'racks = ["a b", "b", "c"]\n'))
    assert "not config" in str(err(base + 'racks = ["a", "b", "c"]\nconfig = { "broker.rack" = "x" }\n'))


def test_empty_controllers_is_combined_mode() -> None:
    c = ok(TWO_CLUSTERS.replace('datacenter = "east"', 'datacenter = "east"\ncontrollers = []')).cluster("east")
    assert c.controllers == () and c.combined
    assert c.voters == c.brokers


def test_unknown_node_names_cluster_and_valid_ids() -> None:
    c: ClusterSpec = ok(TWO_CLUSTERS).cluster("east")
    with pytest.raises(TopologyError) as info:
        c.node(7)
    assert str(info.value) == "cluster 'east' has no node 7; its node ids are 1, 2, 3"
    with pytest.raises(TopologyError):
        c.node_data_dir(0)


def test_unknown_cluster_lookup_names_valid_clusters() -> None:
    topo = ok(TWO_CLUSTERS)
    with pytest.raises(TopologyError) as info:
        topo.cluster("west")
    assert str(info.value) == f"{FILE}: unknown cluster 'west'; clusters: east, aggregate"
    with pytest.raises(TopologyError):
        topo.topics_of("west")


def test_topics_of() -> None:
    topo = load_default(Path("/x"))
    assert [t.name for t in topo.topics_of("west")] == ["pageviews", "clicks", "orders"]
    assert topo.topics_of("aggregate") == []


def test_specs_are_frozen_and_hashable() -> None:
    topo = load_default(Path("/x"))
    c = topo.cluster("east")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"  # type: ignore[misc]
    assert len({c, topo.cluster("west"), c}) == 2
    assert len(set(topo.topics)) == 6 and len(set(topo.mirrors)) == 2


def test_mirror_matches_and_target_topic() -> None:
    m = MirrorSpec("f", "east", "agg", "page.*|clicks", "pages-internal", "{source_dc}-{target}.{topic}")
    assert m.matches("pageviews") and m.matches("clicks")
    assert not m.matches("xclicks")  # the regex must match the whole name
    assert not m.matches("pages-internal")  # excluded
    assert m.target_topic("clicks", "us") == "us-agg.clicks"


def test_format_key_path() -> None:
    assert format_key_path(("clusters", "east", "brokers", 1)) == "clusters.east.brokers[1]"
    assert format_key_path(("topics", 0, "config", "min.insync.replicas")) == 'topics[0].config."min.insync.replicas"'


# -- TOML syntax and reading ---------------------------------------------------------------


def test_toml_syntax_error_names_file_and_line() -> None:
    exc = err('[clusters.east]\ndatacenter = "east"\nbrokers = [1,,]\n')
    assert str(exc) == f"{FILE}:3: invalid TOML: Invalid value (at line 3, column 14)"
    assert exc.line == 3


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError) as info:
        load(tmp_path / "nope.toml")
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: cannot read the topology file: No such file or directory"


def test_string_without_path_is_named_string() -> None:
    with pytest.raises(TopologyError) as info:
        loads("[clusters.east]\ndatacenter = 'east'\n")
    assert str(info.value) == "<string>:1: clusters.east: missing required key 'brokers'"


# -- unknown keys and types ----------------------------------------------------------------


def test_unknown_top_level_key_suggests_closest() -> None:
    text = TWO_CLUSTERS + '\n[warehous]\nsource = "aggregate"\n'
    assert_error(err(text), "warehous", line(text, "[warehous]"),
                 "unknown key 'warehous' (did you mean 'warehouse'?); "
                 "known keys: clusters, topics, mirrors, warehouse, defaults, console")


def test_unknown_key_in_cluster_table_has_line() -> None:
    text = TWO_CLUSTERS.replace('datacenter = "central"', 'datacenter = "central"\nbokers = []')
    assert line(text, "bokers") == 7
    assert_error(err(text), "clusters.aggregate.bokers", 7,
                 "unknown key 'bokers' (did you mean 'brokers'?); "
                 "known keys: datacenter, brokers, controllers, data_dir, config, client, listeners, client_listener, users, racks, registry")


def test_unknown_key_without_close_match() -> None:
    text = TWO_CLUSTERS + '\n[defaults]\nzzz = 1\n'
    assert_error(err(text), "defaults.zzz", line(text, "zzz"),
                 "unknown key 'zzz'; known keys: partitions, replication_factor, config")


def test_unknown_key_in_nth_topics_entry_has_line() -> None:
    text = TWO_CLUSTERS + """
[[topics]]
cluster = "east"
name = "a"

[[topics]]
cluster = "east"
name = "b"

[[topics]]
cluster = "east"
name = "c"
partition = 3
"""
    assert line(text, "partition =") == 20
    assert_error(err(text), "topics[2].partition", 20,
                 "unknown key 'partition' (did you mean 'partitions'?); "
                 "known keys: cluster, name, partitions, replication_factor, config")


def test_unknown_key_in_mirror_and_warehouse() -> None:
    text = TWO_CLUSTERS + '\n[[mirrors]]\nsource = "east"\ntarget = "aggregate"\ntopics = ".*"\nworker = 2\n'
    exc = err(text)
    assert (exc.key_path, exc.line) == ("mirrors[0].worker", line(text, "worker ="))
    assert "(did you mean 'workers'?)" in exc.problem
    text = TWO_CLUSTERS + '\n[warehouse]\nsource = "aggregate"\npaht = "w"\n'
    exc = err(text)
    assert (exc.key_path, exc.line) == ("warehouse.paht", line(text, "paht"))
    assert "(did you mean 'path'?)" in exc.problem


@pytest.mark.parametrize(
    ("replace", "key_path", "problem"),
    [
        ('datacenter = "east"', "clusters.east.datacenter", "must be a string, not an integer"),
        ('brokers = ["127.0.0.1:19092", "127.0.0.1:19093", "127.0.0.1:19094"]', "clusters.east.brokers",
         'must be an array of "host:port" strings, not a string'),
    ],
)
def test_wrong_types_in_cluster(replace: str, key_path: str, problem: str) -> None:
    new = 'datacenter = 5' if "datacenter" in replace else 'brokers = "127.0.0.1:19092"'
    text = TWO_CLUSTERS.replace(replace, new)
    assert_error(err(text), key_path, line(text, new), problem)


def test_broker_address_of_wrong_type() -> None:
    text = TWO_CLUSTERS.replace('"127.0.0.1:19093"', "19093")
    assert_error(err(text), "clusters.east.brokers[1]", 3, 'must be a "host:port" string, not an integer')


def test_cluster_must_be_a_table() -> None:
    exc = err('clusters = { east = 5 }\n')
    assert_error(exc, "clusters.east", 1, "must be a table, not an integer")


def test_topics_must_be_array_of_tables() -> None:
    text = TWO_CLUSTERS.replace("[clusters.east]", 'topics = 3\n[clusters.east]')
    assert_error(err(text), "topics", 1, "must be an array of tables ([[topics]] sections), not an integer")


def test_integer_rejects_bool_and_string() -> None:
    text = TWO_CLUSTERS + '\n[[topics]]\ncluster = "east"\nname = "t"\npartitions = true\n'
    assert_error(err(text), "topics[0].partitions", line(text, "partitions"), "must be an integer, not a boolean")
    text = TWO_CLUSTERS + '\n[[topics]]\ncluster = "east"\nname = "t"\npartitions = "6"\n'
    assert_error(err(text), "topics[0].partitions", line(text, "partitions"), "must be an integer, not a string")


def test_missing_required_keys_point_at_the_table() -> None:
    text = '[clusters.east]\nbrokers = ["h:1"]\n'
    assert_error(err(text), "clusters.east", 1, "missing required key 'datacenter'")
    text = TWO_CLUSTERS + '\n[[topics]]\ncluster = "east"\n'
    assert_error(err(text), "topics[0]", line(text, "[[topics]]"), "missing required key 'name'")


def test_no_clusters() -> None:
    exc = err('[defaults]\npartitions = 3\n')
    assert str(exc) == f"{FILE}: missing required key 'clusters'"
    exc = err("clusters = {}\n")
    assert_error(exc, "clusters", 1, "must define at least one cluster ([clusters.NAME] section)")


def test_empty_string_rejected() -> None:
    text = TWO_CLUSTERS.replace('datacenter = "east"', 'datacenter = ""')
    assert_error(err(text), "clusters.east.datacenter", 2, "must not be empty")


def test_bad_cluster_name() -> None:
    text = TWO_CLUSTERS.replace("[clusters.east]", '[clusters."my east"]')
    assert_error(err(text), 'clusters."my east"', 1,
                 "cluster name 'my east' must be 1 to 249 ASCII letters, digits, '.', '_' or '-' "
                 "(and not '.' or '..')")


# -- brokers and addresses -----------------------------------------------------------------


def test_empty_brokers_list() -> None:
    text = TWO_CLUSTERS.replace('["127.0.0.1:39092", "127.0.0.1:39093", "127.0.0.1:39094"]', "[]")
    assert_error(err(text), "clusters.aggregate.brokers", 7, 'must list at least 1 broker ("host:port")')


def test_broker_count_limit() -> None:
    hosts = ", ".join(f'"h:{p}"' for p in range(1000, 1101))
    exc = err(f'[clusters.big]\ndatacenter = "x"\nbrokers = [{hosts}]\n')
    assert_error(exc, "clusters.big.brokers", 3, "lists 101 brokers; at most 100 are allowed")
    hosts = ", ".join(f'"h:{p}"' for p in range(1000, 1100))
    c = ok(f'[clusters.big]\ndatacenter = "x"\nbrokers = [{hosts}]\n').cluster("big")
    assert len(c.brokers) == 100 and c.brokers[-1] == NodeAddress(100, "h", 1099)


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("localhost", "address 'localhost' must be host:port, e.g. \"127.0.0.1:9092\" or \"[::1]:9092\""),
        (":9092", "address ':9092' must be host:port, e.g. \"127.0.0.1:9092\" or \"[::1]:9092\""),
        ("localhost:0", "address 'localhost:0': port 0 is not between 1 and 65535"),
        ("localhost:65536", "address 'localhost:65536': port 65536 is not between 1 and 65535"),
        ("localhost:90a", "address 'localhost:90a': port '90a' is not a number"),
        ("localhost:", "address 'localhost:': port '' is not a number"),
        ("local host:1", "address 'local host:1': 'local host' is not a host name or IPv4 address "
                         "(IPv6 addresses go in brackets), e.g. \"127.0.0.1:9092\" or \"[::1]:9092\""),
        ("::1:9092", "address '::1:9092': '::1' is not a host name or IPv4 address "
                     "(IPv6 addresses go in brackets), e.g. \"127.0.0.1:9092\" or \"[::1]:9092\""),
        ("[zz::1]:9092", "address '[zz::1]:9092': 'zz::1' is not an IPv6 address"),
    ],
)
def test_bad_broker_address_has_line(address: str, problem: str) -> None:
    text = f"""\
[clusters.east]
datacenter = "east"
brokers = [
    "h:1",
    "{address}",   # node 2
]
"""
    assert_error(err(text), "clusters.east.brokers[1]", 5, problem)


def test_good_addresses() -> None:
    c = ok('[clusters.x]\ndatacenter = "x"\nbrokers = ["[::1]:9092", "kafka-1.example.com:65535", "10.0.0.1:1"]\n')
    assert c.cluster("x").brokers == (
        NodeAddress(1, "::1", 9092),
        NodeAddress(2, "kafka-1.example.com", 65535),
        NodeAddress(3, "10.0.0.1", 1),
    )


def test_same_address_twice_in_one_cluster() -> None:
    text = TWO_CLUSTERS.replace('"127.0.0.1:19094"', '"127.0.0.1:19092"')
    assert_error(err(text), "clusters.east.brokers[2]", 3,
                 "address '127.0.0.1:19092' is already used by clusters.east.brokers[0] (line 3); "
                 "every broker, controller and mirror worker needs its own host:port")


def test_same_address_across_clusters_and_controllers() -> None:
    text = TWO_CLUSTERS.replace('"127.0.0.1:39093"', '"127.0.0.1:19093"')
    exc = err(text)
    assert (exc.key_path, exc.line) == ("clusters.aggregate.brokers[1]", 7)
    assert "already used by clusters.east.brokers[1] (line 3)" in exc.problem
    text = TWO_CLUSTERS + '\n[clusters.c]\ndatacenter = "c"\nbrokers = ["h:1"]\ncontrollers = ["H:1"]\n'
    exc = err(text)
    assert (exc.key_path, exc.line) == ("clusters.c.controllers[0]", line(text, "controllers"))
    assert exc.problem.startswith(f"address 'H:1' is already used by clusters.c.brokers[0] (line {line(text, 'h:1')})")


# -- data_dir ------------------------------------------------------------------------------


def test_data_dir_relative_absolute_and_default(tmp_path: Path) -> None:
    text = TWO_CLUSTERS.replace('datacenter = "east"', 'datacenter = "east"\ndata_dir = "../state/east"')
    text = text.replace('datacenter = "central"', 'datacenter = "central"\ndata_dir = "/srv/agg"')
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "t.toml").write_text(text)
    topo = load(tmp_path / "conf" / "t.toml")
    assert topo.cluster("east").data_dir == tmp_path / "conf" / ".." / "state" / "east"
    assert topo.cluster("aggregate").data_dir == Path("/srv/agg")
    assert ok(TWO_CLUSTERS).cluster("east").data_dir == Path("/base/data/east")
    # base_dir overrides the file's directory
    assert loads(TWO_CLUSTERS, path=FILE, base_dir=tmp_path).cluster("east").data_dir == tmp_path / "data/east"


def test_two_clusters_sharing_a_data_dir() -> None:
    text = TWO_CLUSTERS.replace('datacenter = "central"', 'datacenter = "central"\ndata_dir = "data/east"')
    assert_error(err(text), "clusters.aggregate.data_dir", 7,
                 "data_dir '/base/data/east' is also the data_dir of clusters.east (line 1); clusters need their own")


# -- config --------------------------------------------------------------------------------


def test_config_values_are_normalized_to_strings() -> None:
    text = TWO_CLUSTERS.replace('datacenter = "east"', '''datacenter = "east"
config = { "broker.session.timeout.ms" = 2000, "auto.create.topics.enable" = false, "delete.topic.enable" = true, "broker.rack" = "r1", "x.ratio" = 0.5 }''')
    assert ok(text).cluster("east").config == {
        "broker.session.timeout.ms": "2000",
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
        "broker.rack": "r1",
        "x.ratio": "0.5",
    }


def test_config_dotted_keys_are_flattened() -> None:
    text = TWO_CLUSTERS + """
[clusters.east.config]
log.retention.ms = 60000
"num.partitions" = 3

[[topics]]
cluster = "east"
name = "t"
config.cleanup.policy = "compact"
"""
    topo = ok(text)
    assert topo.cluster("east").config == {"log.retention.ms": "60000", "num.partitions": "3"}
    assert topo.topics[0].config == {"cleanup.policy": "compact"}


def test_line_inside_sub_table_of_second_topics_entry() -> None:
    text = TWO_CLUSTERS + """
[[topics]]
cluster = "east"
name = "a"

[[topics]]
cluster = "east"
name = "b"

[topics.config]
"retention.ms" = 1
"cleanup.policy" = ["compact"]
"""
    exc = err(text)
    assert (exc.key_path, exc.line) == ('topics[1].config."cleanup.policy"', 19)
    assert line(text, "cleanup.policy") == 19


def test_config_same_name_twice() -> None:
    text = TWO_CLUSTERS + '\n[clusters.east.config]\n"a.b" = 1\na.b = 2\n'
    assert_error(err(text), 'clusters.east.config.a.b', line(text, "a.b = 2"),
                 "config 'a.b' is given twice (once as a quoted name, once as dotted keys)")


def test_config_array_value_rejected() -> None:
    text = TWO_CLUSTERS + '\n[[topics]]\ncluster = "east"\nname = "t"\nconfig = { "cleanup.policy" = ["compact", "delete"] }\n'
    assert_error(err(text), 'topics[0].config."cleanup.policy"', line(text, "cleanup.policy"),
                 'config values cannot be arrays; write a list as one comma-separated string, e.g. "compact,delete"')


def test_config_must_be_table() -> None:
    text = TWO_CLUSTERS + '\n[[topics]]\ncluster = "east"\nname = "t"\nconfig = "retention.ms=1"\n'
    assert_error(err(text), "topics[0].config", line(text, "config ="),
                 'must be a table of Kafka config names to values, e.g. { "retention.ms" = 60000 }, not a string')


def test_config_nonfinite_float_rejected() -> None:
    text = TWO_CLUSTERS + '\n[defaults]\nconfig = { "x" = inf }\n'
    assert_error(err(text), "defaults.config.x", line(text, "inf"), "must be a finite number, not inf")


def test_reserved_broker_configs_rejected() -> None:
    text = TWO_CLUSTERS.replace('datacenter = "east"', 'datacenter = "east"\nconfig = { "node.id" = 4 }')
    assert_error(err(text), 'clusters.east.config."node.id"', 3,
                 "'node.id' is set by the topology (brokers, controllers, data_dir), not in config")


def test_defaults_apply_to_topics() -> None:
    text = WEST.lstrip() + """
[defaults]
partitions = 12
replication_factor = 3
config = { "retention.ms" = 1000, "min.insync.replicas" = 1 }

[[topics]]
cluster = "west"
name = "a"
config = { "retention.ms" = 5 }

[[topics]]
cluster = "west"
name = "b"
partitions = 2
"""
    topo = ok(text)
    assert topo.defaults == Defaults(12, 3, {"retention.ms": "1000", "min.insync.replicas": "1"})
    # replication_factor 3 is capped at west's single broker
    assert topo.topics == (
        TopicSpec("west", "a", 12, 1, {"retention.ms": "5", "min.insync.replicas": "1"}),
        TopicSpec("west", "b", 2, 1, {"retention.ms": "1000", "min.insync.replicas": "1"}),
    )


# -- topics --------------------------------------------------------------------------------

TOPIC = TWO_CLUSTERS + """
[[topics]]
cluster = "east"
name = "pageviews"
"""


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ("partitions = 0", "must be between 1 and 10000, not 0"),
        ("partitions = 10001", "must be between 1 and 10000, not 10001"),
        ("replication_factor = 0", "must be at least 1, not 0"),
        ("replication_factor = 4", "replication_factor 4 is more than the 3 broker(s) of cluster 'east'"),
    ],
)
def test_partitions_and_replication_factor_bounds(setting: str, problem: str) -> None:
    text = TOPIC + setting + "\n"
    assert_error(err(text), "topics[0]." + setting.split()[0], line(text, setting), problem)


def test_partition_and_rf_limits_accepted() -> None:
    topo = ok(TOPIC + "partitions = 10000\nreplication_factor = 3\n")
    assert (topo.topics[0].partitions, topo.topics[0].replication_factor) == (10000, 3)


def test_defaults_bounds() -> None:
    text = TWO_CLUSTERS + "\n[defaults]\npartitions = 0\n"
    assert_error(err(text), "defaults.partitions", line(text, "partitions"), "must be between 1 and 10000, not 0")
    text = TWO_CLUSTERS + "\n[defaults]\nreplication_factor = 0\n"
    assert_error(err(text), "defaults.replication_factor", line(text, "replication_factor"),
                 "must be at least 1, not 0")


def test_topic_unknown_cluster() -> None:
    text = TOPIC.replace('cluster = "east"', 'cluster = "eats"')
    assert_error(err(text), "topics[0].cluster", line(text, "eats"),
                 "unknown cluster 'eats' (did you mean 'east'?); clusters: east, aggregate")


def test_duplicate_topic() -> None:
    text = TOPIC + TOPIC[len(TWO_CLUSTERS):]
    assert_error(err(text), "topics[1].name", line(text, 'name = "pageviews"', 2),
                 f"topic 'pageviews' of cluster 'east' is already declared at topics[0] (line {line(text, '[[topics]]')})")
    # the same name on another cluster is fine
    topo = ok(TOPIC + TOPIC[len(TWO_CLUSTERS):].replace("east", "aggregate"))
    assert [(t.cluster, t.name) for t in topo.topics] == [("east", "pageviews"), ("aggregate", "pageviews")]


def test_topic_names_colliding_in_metrics() -> None:
    text = TOPIC.replace("pageviews", "page.views") + TOPIC[len(TWO_CLUSTERS):].replace("pageviews", "page_views")
    assert_error(err(text), "topics[1].name", line(text, "page_views"),
                 f"topic 'page_views' collides with 'page.views' (topics[0] (line {line(text, '[[topics]]')})): "
                 "Kafka refuses names that differ only in '.' and '_'")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "must not be empty"),
        (".", "topic name '.' is not allowed"),
        ("..", "topic name '..' is not allowed"),
        ("a" * 250, "topic name is 250 characters long; Kafka allows at most 249"),
        ("page views/x", "topic name 'page views/x' has ' ', '/'; Kafka allows only ASCII letters, digits, '.', '_' and '-'"),
        ("café", "topic name 'café' has 'é'; Kafka allows only ASCII letters, digits, '.', '_' and '-'"),
        ("__consumer_offsets", "topic name '__consumer_offsets': names starting with '__' are for Kafka's internal topics"),
    ],
)
def test_invalid_topic_names(name: str, problem: str) -> None:
    text = TOPIC.replace('"pageviews"', f'"{name}"')
    assert_error(err(text), "topics[0].name", line(text, "name ="), problem)


def test_legal_topic_names() -> None:
    for name in ("a" * 249, "A-b_c.9", "..."):
        assert ok(TOPIC.replace('"pageviews"', f'"{name}"')).topics[0].name == name


def test_topics_as_inline_array_have_lines() -> None:
    text = TWO_CLUSTERS.replace("[clusters.east]", """topics = [
  { cluster = "east", name = "a" },
  { cluster = "east", name = "b", partitons = 2 },
]
[clusters.east]""")
    exc = err(text)
    assert (exc.key_path, exc.line) == ("topics[1].partitons", 3)


# -- mirrors -------------------------------------------------------------------------------

THREE_CLUSTERS = TWO_CLUSTERS + WEST


def mirror(source: str, target: str, topics: str = ".*", **extra: str | int) -> str:
    lines = ["", "[[mirrors]]", f'source = "{source}"', f'target = "{target}"', f'topics = "{topics}"']
    for key, value in extra.items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}")
    return "\n".join(lines) + "\n"


def test_mirror_defaults_and_options() -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate") + mirror(
        "west", "aggregate", "a.*", name="w", exclude="a-internal", rename="{source_dc}.{source}.{topic}",
        workers=4, groups="app-.*") + '\n[mirrors.config]\n"producer.batch.size" = 100\n'
    topo = ok(text)
    assert topo.mirrors == (
        MirrorSpec("east-to-aggregate", "east", "aggregate", ".*", None, "{source}.{topic}", 1, None, {}),
        MirrorSpec("w", "west", "aggregate", "a.*", "a-internal", "{source_dc}.{source}.{topic}", 4, "app-.*",
                   {"producer.batch.size": "100"}),
    )


def test_mirror_unknown_clusters() -> None:
    text = THREE_CLUSTERS + mirror("north", "aggregate")
    assert_error(err(text), "mirrors[0].source", line(text, "north"),
                 "unknown cluster 'north'; clusters: east, aggregate, west")
    text = THREE_CLUSTERS + mirror("east", "agregate")
    assert_error(err(text), "mirrors[0].target", line(text, "agregate"),
                 "unknown cluster 'agregate' (did you mean 'aggregate'?); clusters: east, aggregate, west")


def test_mirror_into_itself() -> None:
    text = THREE_CLUSTERS + mirror("east", "east")
    assert_error(err(text), "mirrors[0].target", line(text, 'target = "east"'),
                 "a flow cannot mirror cluster 'east' into itself")


def test_mirror_missing_topics() -> None:
    text = THREE_CLUSTERS + '\n[[mirrors]]\nsource = "east"\ntarget = "aggregate"\n'
    assert_error(err(text), "mirrors[0]", line(text, "[[mirrors]]"), "missing required key 'topics'")


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("topics", "page(views", "invalid regex 'page(views': missing ), unterminated subpattern at position 4"),
        ("exclude", "*x", "invalid regex '*x': nothing to repeat at position 0"),
        ("groups", "[a-", "invalid regex '[a-': unterminated character set at position 0"),
    ],
)
def test_mirror_invalid_regex(key: str, value: str, problem: str) -> None:
    extra = {key: value} if key != "topics" else {}
    text = THREE_CLUSTERS + mirror("east", "aggregate", value if key == "topics" else ".*", **extra)
    assert_error(err(text), f"mirrors[0].{key}", line(text, f"{key} ="), problem)


ALLOWED = "allowed: {source}, {target}, {topic}, {source_dc}"


@pytest.mark.parametrize(
    ("rename", "problem"),
    [
        ("{source}", "rename template '{source}' must contain {topic} (allowed placeholders: " + ALLOWED[9:] + ")"),
        ("{cluster}.{topic}", "rename template '{cluster}.{topic}': unknown placeholder {cluster}; " + ALLOWED),
        ("{}.{topic}", "rename template '{}.{topic}': unknown placeholder {}; " + ALLOWED),
        ("{topic:>5}", "rename template '{topic:>5}': unknown placeholder {topic:>5}; " + ALLOWED),
        ("{topic!r}", "rename template '{topic!r}': unknown placeholder {topic!r}; " + ALLOWED),
        ("{topic", "bad rename template '{topic': expected '}' before end of string "
                   "(write literal braces as {{ and }})"),
        ("{source}/{topic}", "rename template '{source}/{topic}' has '/' outside placeholders; "
                             "topic names allow only ASCII letters, digits, '.', '_' and '-'"),
    ],
)
def test_mirror_bad_rename_template(rename: str, problem: str) -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate", rename=rename)
    assert_error(err(text), "mirrors[0].rename", line(text, "rename ="), problem)


def test_mirror_workers_bounds() -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate", workers=0)
    assert_error(err(text), "mirrors[0].workers", line(text, "workers"), "must be between 1 and 1000, not 0")


def test_mirror_names_must_be_unique() -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate", "a") + mirror("east", "aggregate", "b")
    assert_error(err(text), "mirrors[1]", line(text, "[[mirrors]]", 2),
                 f"flow name 'east-to-aggregate' is already used by mirrors[0] (line {line(text, '[[mirrors]]')}); "
                 "give one of them a distinct `name`")
    text = THREE_CLUSTERS + mirror("east", "aggregate", "a", name="x") + mirror("west", "aggregate", "b", name="x")
    exc = err(text)
    assert (exc.key_path, exc.line) == ("mirrors[1].name", line(text, 'name = "x"', 2))
    topo = ok(THREE_CLUSTERS + mirror("east", "aggregate", "a") + mirror("east", "aggregate", "b", name="east-b"))
    assert [m.name for m in topo.mirrors] == ["east-to-aggregate", "east-b"]


def test_mirror_same_topics_twice() -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate", "a|b") + mirror("east", "aggregate", "a|b", name="again")
    assert_error(err(text), "mirrors[1].topics", line(text, 'topics = "a|b"', 2),
                 f"flow 'again' copies the same topics from 'east' to 'aggregate' as flow 'east-to-aggregate' "
                 f"(mirrors[0] (line {line(text, '[[mirrors]]')}))")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("{topic}", "{source}.{topic}"),
        ("{source}.{topic}", "{topic}"),
        ("{target}.{topic}", "{target}.{topic}"),
        ("{source}.{topic}", "{source_dc}.{topic}"),
    ],
)
def test_flows_into_one_target_that_could_collide(first: str, second: str) -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate", rename=first) + mirror("west", "aggregate", rename=second)
    assert_error(err(text), "mirrors[1].rename", line(text, "rename =", 2),
                 f"flows 'east-to-aggregate' (mirrors[0] (line {line(text, '[[mirrors]]')})) and 'west-to-aggregate' "
                 f"both copy into 'aggregate' with rename templates {first!r} and {second!r}, which can give "
                 "topics from different sources the same target name; put {source} in both (or {source_dc}, "
                 "when the sources are in different datacenters)")


def test_flows_with_source_dc_need_different_datacenters() -> None:
    same_dc = THREE_CLUSTERS.replace('datacenter = "west"', 'datacenter = "east"')
    text = same_dc + mirror("east", "aggregate", rename="{source_dc}.{topic}") + mirror(
        "west", "aggregate", rename="{source_dc}.{topic}")
    assert err(text).key_path == "mirrors[1].rename"
    text = THREE_CLUSTERS + mirror("east", "aggregate", rename="{source_dc}.{topic}") + mirror(
        "west", "aggregate", rename="{source_dc}.{topic}")
    assert [m.rename for m in ok(text).mirrors] == ["{source_dc}.{topic}", "{source_dc}.{topic}"]


def test_single_identity_flow_per_target_is_fine() -> None:
    text = THREE_CLUSTERS + mirror("east", "aggregate", rename="{topic}") + mirror("west", "east", rename="w.{topic}")
    assert [m.rename for m in ok(text).mirrors] == ["{topic}", "w.{topic}"]


def test_declared_topics_renamed_to_the_same_name() -> None:
    text = TOPIC + '\n[[topics]]\ncluster = "east"\nname = "x.pageviews"\n' + mirror(
        "east", "aggregate", "pageviews", rename="x.{topic}") + mirror(
        "east", "aggregate", "x\\\\.pageviews", name="raw", rename="{topic}")
    assert_error(err(text), "mirrors[1]", line(text, "[[mirrors]]", 2),
                 "flows 'east-to-aggregate' (topic 'pageviews') and 'raw' (topic 'x.pageviews') would both "
                 "write topic 'x.pageviews' of cluster 'aggregate'")


def test_declared_topic_renamed_to_an_illegal_name() -> None:
    text = TOPIC.replace('"pageviews"', '"' + "p" * 245 + '"') + mirror("east", "aggregate")
    assert_error(err(text), "mirrors[0].rename", line(text, "[[mirrors]]"),
                 f"topic {'p' * 245!r} of 'east' would be renamed to {'east.' + 'p' * 245!r}: "
                 "topic name is 250 characters long; Kafka allows at most 249")


def test_identity_cycle_of_two() -> None:
    text = THREE_CLUSTERS + mirror("east", "west", rename="{topic}") + mirror("west", "east", rename="{topic}")
    assert_error(err(text), "mirrors[0].rename", line(text, "rename ="),
                 "flows 'east-to-west', 'west-to-east' form a cycle east -> west -> east and all keep topic "
                 'names (rename = "{topic}"), so a topic would be copied around it forever; give at least one '
                 "of them a rename template with {source}")


def test_identity_cycle_of_three() -> None:
    text = THREE_CLUSTERS + mirror("aggregate", "west", rename="{topic}") + mirror(
        "east", "aggregate", rename="{topic}") + mirror("west", "east", rename="{topic}")
    exc = err(text)
    assert exc.key_path == "mirrors[0].rename"
    assert exc.problem.startswith("flows 'aggregate-to-west', 'west-to-east', 'east-to-aggregate' form a cycle "
                                  "aggregate -> west -> east -> aggregate and all keep topic names")


def test_cycle_broken_by_a_renaming_flow_is_allowed() -> None:
    text = THREE_CLUSTERS + mirror("east", "west", rename="{topic}") + mirror("west", "east")
    assert [m.name for m in ok(text).mirrors] == ["east-to-west", "west-to-east"]


# -- warehouse -----------------------------------------------------------------------------


def test_warehouse_defaults_and_resolution() -> None:
    topo = ok(TWO_CLUSTERS + '\n[warehouse]\nsource = "aggregate"\n')
    assert topo.warehouse == WarehouseSpec("aggregate", Path("/base/warehouse"), ".*", {})
    topo = ok(TWO_CLUSTERS + '\n[warehouse]\nsource = "aggregate"\npath = "/w"\ntopics = "east\\\\..*"\n'
              'config = { "spark.executor.memory" = "2g" }\n')
    assert topo.warehouse == WarehouseSpec("aggregate", Path("/w"), "east\\..*", {"spark.executor.memory": "2g"})
    assert ok(TWO_CLUSTERS).warehouse is None


def test_warehouse_unknown_source() -> None:
    text = TWO_CLUSTERS + '\n[warehouse]\nsource = "central"\n'
    assert_error(err(text), "warehouse.source", line(text, "central", 2),
                 "unknown cluster 'central'; clusters: east, aggregate")


def test_warehouse_bad_regex() -> None:
    text = TWO_CLUSTERS + '\n[warehouse]\nsource = "aggregate"\ntopics = "("\n'
    assert_error(err(text), "warehouse.topics", line(text, "topics ="),
                 "invalid regex '(': missing ), unterminated subpattern at position 0")


# -- dcmirror topology check ---------------------------------------------------------------


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dcmirror")
    sub = parser.add_subparsers(dest="command", required=True)
    topology_cmd.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_topology_check_prints_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = default_topology_text().replace('brokers = ["127.0.0.1:29092", "127.0.0.1:29093", "127.0.0.1:29094"]',
                                           'brokers = ["127.0.0.1:29092"]\ncontrollers = ["127.0.0.1:29192"]')
    text = text.replace('EXTERNAL = ["127.0.0.1:29095", "127.0.0.1:29096", "127.0.0.1:29097"]',
                        'EXTERNAL = ["127.0.0.1:29095"]')
    text = text.replace('LOCAL = ["127.0.0.1:29098", "127.0.0.1:29099", "127.0.0.1:29100"]', 'LOCAL = ["127.0.0.1:29098"]')
    text = text.replace('[[topics]]\ncluster = "west"\nname = "pageviews"\npartitions = 6\nreplication_factor = 3',
                        '[[topics]]\ncluster = "west"\nname = "pageviews"\npartitions = 6\nreplication_factor = 1')
    text = text.replace('[[topics]]\ncluster = "west"\nname = "clicks"\npartitions = 6\nreplication_factor = 3',
                        '[[topics]]\ncluster = "west"\nname = "clicks"\npartitions = 6\nreplication_factor = 1')
    text = text.replace('name = "orders"                      # JSON Schema orders (JSONSerializer against west\'s '
                        'registry)\npartitions = 3\nreplication_factor = 3',
                        'name = "orders"\npartitions = 3\nreplication_factor = 1')
    path = tmp_path / "topology.toml"
    path.write_text(text)
    dev_secrets(path)
    assert run_cli(["topology", "check", str(path)]) == 0
    out, err_text = capsys.readouterr()
    assert err_text == ""
    assert out == f"""\
{path}: OK

clusters (3):
  CLUSTER    DATACENTER  BROKERS  VOTERS            DATA-DIR
  east       east        3        1,2,3 (combined)  {tmp_path}/data/east
  west       west        1        2 (controllers)   {tmp_path}/data/west
  aggregate  central     3        1,2,3 (combined)  {tmp_path}/data/aggregate

  CLUSTER    NODE  ADDRESS          ROLE
  east       1     127.0.0.1:19092  broker, voter
  east       2     127.0.0.1:19093  broker, voter
  east       3     127.0.0.1:19094  broker, voter
  west       1     127.0.0.1:29092  broker
  west       2     127.0.0.1:29192  controller
  aggregate  1     127.0.0.1:39092  broker, voter
  aggregate  2     127.0.0.1:39093  broker, voter
  aggregate  3     127.0.0.1:39094  broker, voter

  CLUSTER    LISTENER  PROTOCOL   ADDRESSES                                        USED BY
  east       BROKER    SSL        127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094  brokers
  east       EXTERNAL  SASL_SSL   127.0.0.1:19095,127.0.0.1:19096,127.0.0.1:19097  dcmirror clients
  east       LOCAL     PLAINTEXT  127.0.0.1:19098,127.0.0.1:19099,127.0.0.1:19100  -
  west       BROKER    SSL        127.0.0.1:29092                                  brokers
  west       EXTERNAL  SASL_SSL   127.0.0.1:29095                                  dcmirror clients
  west       LOCAL     PLAINTEXT  127.0.0.1:29098                                  -
  aggregate  BROKER    SSL        127.0.0.1:39092,127.0.0.1:39093,127.0.0.1:39094  brokers
  aggregate  EXTERNAL  SASL_SSL   127.0.0.1:39095,127.0.0.1:39096,127.0.0.1:39097  dcmirror clients
  aggregate  LOCAL     PLAINTEXT  127.0.0.1:39098,127.0.0.1:39099,127.0.0.1:39100  -
  east starts with SCRAM users: admin, mirror
  west starts with SCRAM users: admin, mirror
  aggregate starts with SCRAM users: admin, mirror

schema registries:
  east on http://127.0.0.1:18081
  west on http://127.0.0.1:28081
  aggregate on http://127.0.0.1:38081

topics (6):
  CLUSTER  TOPIC      PARTITIONS  RF  CONFIG
  east     pageviews  6           3   min.insync.replicas=2
  east     clicks     6           3   min.insync.replicas=2
  east     orders     3           3   min.insync.replicas=2
  west     pageviews  6           1   min.insync.replicas=2
  west     clicks     6           1   min.insync.replicas=2
  west     orders     3           1   min.insync.replicas=2

flows (2):
  FLOW               SOURCE  TARGET     TOPICS                   EXCLUDE  RENAME            WORKERS  GROUPS
  east-to-aggregate  east    aggregate  pageviews|clicks|orders  -        {{source}}.{{topic}}  2        -
  west-to-aggregate  west    aggregate  pageviews|clicks|orders  -        {{source}}.{{topic}}  2        -
  east-to-aggregate copies declared topics: pageviews -> east.pageviews, clicks -> east.clicks, orders -> east.orders
  east-to-aggregate copies their schemas into aggregate's registry, context .east
  west-to-aggregate copies declared topics: pageviews -> west.pageviews, clicks -> west.clicks, orders -> west.orders
  west-to-aggregate copies their schemas into aggregate's registry, context .west

warehouse: topics .* of cluster aggregate into {tmp_path}/warehouse
  topics (east|west)[.]orders: typed tables from aggregate's registry
  warehouse service: one Spark session for loads and `warehouse sql` (load.service)

web console: http://127.0.0.1:18480/
"""


def test_topology_check_minimal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[clusters.solo]\ndatacenter = "dc1"\nbrokers = ["localhost:9092"]\n')
    assert run_cli(["topology", "check", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert out == f"""\
{path}: OK

clusters (1):
  CLUSTER  DATACENTER  BROKERS  VOTERS        DATA-DIR
  solo     dc1         1        1 (combined)  {tmp_path}/data/solo

  CLUSTER  NODE  ADDRESS         ROLE
  solo     1     localhost:9092  broker, voter

topics (0):

flows (0):

warehouse: none
"""


def test_topology_check_reports_errors_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[clusters.solo]\ndatacenter = "dc1"\nbrokers = ["localhost:99999"]\n')
    assert run_cli(["topology", "check", str(path)]) == 2
    out, err_text = capsys.readouterr()
    assert out == ""
    assert err_text == (f"dcmirror topology check: {path}:3: clusters.solo.brokers[0]: "
                        "address 'localhost:99999': port 99999 is not between 1 and 65535\n")


def test_topology_check_requires_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["topology", "check"]) == 2
    assert "which topology file? give it as --config FILE" in capsys.readouterr().err


def test_mirror_config_keys_are_checked_with_file_line_and_suggestion() -> None:
    text = """
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092"]
[clusters.aggregate]
datacenter = "central"
brokers = ["127.0.0.1:39092"]
[[mirrors]]
source = "east"
target = "aggregate"
topics = "pageviews"
config = { "topic.refresh.msx" = "1000" }
"""
    import pytest

    from topology import TopologyError, loads

    with pytest.raises(TopologyError, match=r":12: .*unknown mirror config 'topic.refresh.msx' [(]did you mean 'topic.refresh.ms'[?][)]"):
        loads(text, path=None)
    with pytest.raises(TopologyError, match="takes a whole number"):
        loads(text.replace('"topic.refresh.msx" = "1000"', '"topic.refresh.ms" = "soon"'), path=None)
    ok = loads(text.replace('"topic.refresh.msx" = "1000"', '"topic.refresh.ms" = 1000, "producer.linger.ms" = 10'),
               path=None)
    assert ok.mirrors[0].config == {"topic.refresh.ms": "1000", "producer.linger.ms": "10"}
    with pytest.raises(TopologyError, match=r":12: .*'on.topic.recreated' takes one of mirror, stop, not 'skip'"):
        loads(text.replace('"topic.refresh.msx" = "1000"', '"on.topic.recreated" = "skip"'), path=None)
    with pytest.raises(TopologyError, match=r"did you mean 'on.topic.recreated'"):
        loads(text.replace('"topic.refresh.msx" = "1000"', '"on.topic.recreate" = "stop"'), path=None)
    stop = loads(text.replace('"topic.refresh.msx" = "1000"', '"on.topic.recreated" = "stop"'), path=None)
    assert stop.mirrors[0].config == {"on.topic.recreated": "stop"}
    with pytest.raises(TopologyError, match=r":12: .*num.replica.fetchers takes 1..16, not 0"):
        loads(text.replace('"topic.refresh.msx" = "1000"', '"num.replica.fetchers" = 0'), path=None)
    fetchers = loads(text.replace('"topic.refresh.msx" = "1000"', '"num.replica.fetchers" = 4'), path=None)
    from mirror.worker import WorkerConfig
    assert WorkerConfig.from_flow(fetchers.mirrors[0]).replica_fetchers == 4


# -- listeners, client_listener, users -------------------------------------------------------

SECURED = """\
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092", "127.0.0.1:19093"]
client_listener = "external"
listeners = { EXTERNAL = ["127.0.0.1:19095", "127.0.0.1:19096"], LOCAL = ["127.0.0.1:19098", "127.0.0.1:19099"] }
users = { admin = "${file:secrets/p.properties:admin}", "svc.x" = "${env:X_PW}" }
config = { "listener.security.protocol.map" = "BROKER:SSL,EXTERNAL:SASL_SSL,LOCAL:PLAINTEXT", "inter.broker.listener.name" = "BROKER" }
"""


def test_listeners_give_every_broker_its_addresses_and_clients_their_bootstrap() -> None:
    c = ok(SECURED).cluster("east")
    assert c.inter_broker_listener == "BROKER" and c.client_listener == "EXTERNAL"
    assert c.node_listeners(2) == "BROKER://127.0.0.1:19093,EXTERNAL://127.0.0.1:19096,LOCAL://127.0.0.1:19099"
    assert c.bootstrap() == "127.0.0.1:19095,127.0.0.1:19096" and c.bootstrap("local") == "127.0.0.1:19098,127.0.0.1:19099"
    assert c.client_config()["bootstrap.servers"] == "127.0.0.1:19095,127.0.0.1:19096"
    # relative reference paths resolve against the file's directory; env names stay
    assert c.users == {"admin": "${file:/base/secrets/p.properties:admin}", "svc.x": "${env:X_PW}"}
    with pytest.raises(TopologyError, match="has no listener 'OTHER'"):
        c.bootstrap("other")


@pytest.mark.parametrize(("change", "key_path", "problem"), [
    ('LOCAL = ["127.0.0.1:19098", "127.0.0.1:19099"]', "clusters.east.listeners.LOCAL",
     'must be an array of 2 "host:port" strings, one per broker in the order of `brokers`'),
    ('LOCAL = ["127.0.0.1:19098", "127.0.0.1:19092"]', "clusters.east.listeners.LOCAL[1]",
     "address '127.0.0.1:19092' is already used by clusters.east.brokers[0] (line 3); every broker, controller "
     "and mirror worker needs its own host:port"),
    ('OTHER = ["127.0.0.1:19198", "127.0.0.1:19199"]', "clusters.east.listeners.OTHER",
     'listener OTHER has no protocol: name it after one (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) or map it in '
     'config "listener.security.protocol.map" (e.g. "OTHER:SASL_SSL")'),
    ('users = { admin = "hunter2-inline" }', "clusters.east.users.admin",
     'must be a reference to the password, never the password: "${file:/etc/dcmirror/passwords.properties:KEY}", '
     '"${dir:/run/secrets:FILE}" or "${env:VARIABLE}"'),
    ('client_listener = "nope"', "clusters.east.client_listener",
     "'NOPE' is not a listener of cluster 'east'; its listeners: BROKER, EXTERNAL, LOCAL"),
    ('controllers = ["127.0.0.1:19192"]\nconfig = { "listener.security.protocol.map" = "BROKER:SASL_SSL,EXTERNAL:SSL,LOCAL:SSL", '
     '"inter.broker.listener.name" = "BROKER" }', "clusters.east.controllers",
     "dedicated controllers cannot use SASL (the inter-broker listener BROKER is SASL_SSL): the quorum forms "
     "before any SCRAM user exists; use SSL (mutual TLS)"),
])
def test_listener_and_user_mistakes_are_named(change: str, key_path: str, problem: str) -> None:
    lines = SECURED.splitlines()
    if change.startswith("LOCAL") or change.startswith("OTHER"):
        two = "LOCAL = [\"127.0.0.1:19098\", \"127.0.0.1:19099\"]"
        text = SECURED.replace(two, change.replace('"127.0.0.1:19099"]', '"127.0.0.1:19099"]')
                               if change != two else 'LOCAL = ["127.0.0.1:19098"]')
        if change.startswith("OTHER"):
            text = SECURED.replace(" }\nusers", f", {change} }}\nusers")
    else:
        keys = [ln.split(" =")[0] + " =" for ln in change.splitlines()]
        kept = [ln for ln in lines if not ln.startswith(tuple(keys))]
        text = "\n".join(kept[:3] + [change] + kept[3:]) + "\n"
    exc = err(text)
    assert exc.key_path == key_path and exc.problem == problem, str(exc)
    assert "hunter2-inline" not in str(exc)


def test_dev_secrets_makes_what_the_topology_references_once(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(default_topology_text())
    made = dev_secrets(path)
    assert sorted(p.name for p in made.files) == ["broker.pem", "ca.pem"]
    assert made.passwords == [f"{tmp_path}/secrets/passwords.properties:admin",
                              f"{tmp_path}/secrets/passwords.properties:mirror"]
    assert (tmp_path / "secrets" / "passwords.properties").stat().st_mode & 0o777 == 0o600
    before = {p.name: p.read_bytes() for p in (tmp_path / "secrets").iterdir()}
    again = dev_secrets(path)
    assert again.files == [] and again.passwords == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "secrets").iterdir()} == before
    load(path)  # every referenced file exists and is valid


def test_mirror_admin_http_token_is_a_reference_and_its_keystore_is_checked(tmp_path: Path) -> None:
    flow = TWO_CLUSTERS + '\n[[mirrors]]\nsource = "east"\ntarget = "aggregate"\ntopics = "pv"\nconfig = { %s }\n'
    exc = err(flow % '"http.port.base" = 9100, "http.auth.token" = "hunter2-inline"')
    assert exc.key_path == 'mirrors[0].config."http.auth.token"' and "holds a secret inline" in exc.problem
    assert "hunter2-inline" not in str(exc)
    exc = err(flow % '"http.ssl.keystore.location" = "missing.pem"')
    assert exc.key_path == 'mirrors[0].config."http.ssl.keystore.location"' and "does not exist" in exc.problem
    topo = ok(flow % '"http.port.base" = 9100, "http.host" = "0.0.0.0", "http.auth.token" = "${env:TOKEN}"')
    assert topo.mirrors[0].config["http.auth.token"] == "${env:TOKEN}"


def test_topology_commands_take_the_file_as_every_other_command_does(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`--config FILE` as `dcmirror mirror|up|load` take it (the runbook's `topology plan
    --config F` was refused with argparse's exit 2, plan's own "changes pending"), or FILE."""
    path = tmp_path / "topology.toml"
    path.write_text(default_topology_text())
    dev_secrets(path)
    assert run_cli(["topology", "check", "--config", str(path)]) == 0
    assert f"{path}: OK" in capsys.readouterr().out
    assert run_cli(["topology", "check", str(path), "--config", str(path)]) == 0
    capsys.readouterr()
    assert run_cli(["topology", "check", str(path), "--config", str(tmp_path / "other.toml")]) == 2
    assert "two topology files given" in capsys.readouterr().err
    assert run_cli(["topology", "check"]) == 2
    assert "give it as --config FILE" in capsys.readouterr().err
    # plan and apply read it the same way (nothing listens: plan says the cluster is unreachable, 1)
    assert run_cli(["topology", "plan", "--config", str(path), "--timeout", "0.5", "--cluster", "east"]) == 1
    assert "--config" not in capsys.readouterr().err


def test_misspelt_config_names_are_refused_at_check_with_file_line_and_a_suggestion(tmp_path: Path) -> None:
    """Issue 41: topic, broker and client config names are checked when the file is read, not
    first at `topology apply` against live brokers."""
    from deploy.config_names import CONFIG_NAMES
    from topology.load import loads

    base = """
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092"]
config = { "log.retention.hours" = "24" }
[clusters.aggregate]
datacenter = "central"
brokers = ["127.0.0.1:39092"]
[[topics]]
cluster = "east"
name = "orders"
config = { "min.insync.replicas" = "1" }
[[mirrors]]
source = "east"
target = "aggregate"
topics = "orders"
config = { "source.sasl.username" = "app", "producer.linger.ms" = "10", "consumer.fetch.max.bytes" = "1048576" }
"""
    loads(base, config_names=CONFIG_NAMES, check_files=False)  # every name right
    cases = [
        ('"min.insync.replicas" = "1"', '"min.insync.replica" = "1"',
         r':12: topics\[0\]\.config\."min\.insync\.replica": unknown topic config \'min\.insync\.replica\' '
         r"\(did you mean 'min\.insync\.replicas'\?\)"),
        ('"log.retention.hours" = "24"', '"log.retention.hour" = "24"',
         r':5: clusters\.east\.config\."log\.retention\.hour": unknown broker config \'log\.retention\.hour\' '
         r"\(did you mean 'log\.retention\.hours'\?\)"),
        ('"source.sasl.username"', '"source.sasl.usrname"',
         r':17: mirrors\[0\]\.config\."source\.sasl\.usrname": unknown client config \'sasl\.usrname\' '
         r"\(did you mean 'sasl\.username'\?\)"),
        ('"producer.linger.ms"', '"producer.linger"', r"unknown producer config 'linger'"),
        ('"consumer.fetch.max.bytes"', '"consumer.batch.size"', r"unknown consumer config 'batch\.size'"),
    ]
    for old, new, says in cases:
        assert old in base
        with pytest.raises(TopologyError, match=says):
            loads(base.replace(old, new), config_names=CONFIG_NAMES, check_files=False)
    # Without the broker's names (a worker reading the file) only client settings are checked.
    loads(base.replace('"min.insync.replicas"', '"min.insync.replica"'), check_files=False)


def test_config_values_a_broker_would_refuse_are_errors_at_check() -> None:
    """Issue 41: a known name with a value the broker refuses (not a number, out of range, not
    one of the choices) failed only at `topology apply`: now at the file's line, in the
    broker's own words (Kafka's ConfigException wording)."""
    from deploy.config_names import CONFIG_NAMES
    from topology.load import loads

    base = """
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092"]
config = { "log.retention.hours" = "24", "num.partitions" = "3" }
[[topics]]
cluster = "east"
name = "orders"
config = { "min.insync.replicas" = "1", "cleanup.policy" = "compact", "retention.ms" = "-1" }
"""
    loads(base, config_names=CONFIG_NAMES, check_files=False)
    cases = [
        ('"min.insync.replicas" = "1"', '"min.insync.replicas" = "two"',
         r':9: topics\[0\]\.config\."min\.insync\.replicas": Invalid value two for configuration '
         r"min\.insync\.replicas"),
        ('"min.insync.replicas" = "1"', '"min.insync.replicas" = "0"', r"Value must be at least 1"),
        ('"cleanup.policy" = "compact"', '"cleanup.policy" = "bogus"', r"String must be one of: compact, delete"),
        ('"retention.ms" = "-1"', '"retention.ms" = "99999999999999999999"', r"Invalid value 99999999999999999999"),
        ('"num.partitions" = "3"', '"num.partitions" = "three"',
         r':5: clusters\.east\.config\."num\.partitions": Invalid value three'),
    ]
    for old, new, says in cases:
        assert old in base
        with pytest.raises(TopologyError, match=says):
            loads(base.replace(old, new), config_names=CONFIG_NAMES, check_files=False)


def test_the_default_topology_uses_only_known_config_names() -> None:
    from deploy.config_names import CONFIG_NAMES
    from topology.load import loads

    loads(default_topology_text(), config_names=CONFIG_NAMES, check_files=False)


def test_a_fresh_copy_of_the_default_topology_is_told_how_to_make_its_secrets(tmp_path: Path) -> None:
    """Issue 41: `cp topology/default.toml my.toml && dcmirror topology check my.toml` failed
    with "secrets/broker.pem does not exist" and nothing about dev-secrets; the README's steps
    now run it, and the error names it."""
    path = tmp_path / "my.toml"
    path.write_text(default_topology_text())
    with pytest.raises(TopologyError, match=r"does not exist; for a first try, `dcmirror dev-secrets --config "
                                           + re.escape(str(path)) + "` makes"):
        load(path)
    dev_secrets(path)
    load(path)
