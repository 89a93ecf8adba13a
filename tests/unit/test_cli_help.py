"""Every command and option of `dcmirror` says what it is for (issue 41: 61 options had no
help text), and `dcmirror --help` lists the commands by name."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from deploy.cli import build_parser


def test_every_command_and_option_has_help_text() -> None:
    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    if not helps.get(name):
                        missing.append(f"{path} {name}")
                    walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "dcmirror")
    assert not missing, missing


def test_commands_are_listed_by_name() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    listed = [a.dest for a in sub._choices_actions]
    assert listed == sorted(listed) and {"produce", "consume", "mirror", "topology", "up"} <= set(listed)


def test_topics_config_follows_kafka_topics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kafka-topics' `--config KEY=VALUE` is a topic config; dcmirror's `--config FILE` the
    topology file: one option, told apart by the `=` (issue 41); --bootstrap-server as Kafka's."""
    parser = build_parser()
    args = parser.parse_args(["topics", "create", "t", "--bootstrap-server", "127.0.0.1:9092",
                              "--config", "cleanup.policy=compact", "--set", "retention.ms=5",
                              "--config", "min.insync.replicas=2"])
    assert args.bootstrap == "127.0.0.1:9092" and args.config is None
    assert args.topic_config == ["cleanup.policy=compact", "retention.ms=5", "min.insync.replicas=2"]
    topology = tmp_path / "t.toml"
    topology.write_text("")
    args = parser.parse_args(["topics", "alter", "t", "--config", str(topology), "--cluster", "east",
                              "--config", "retention.ms=7", "--delete-config", "cleanup.policy"])
    assert args.config == str(topology) and args.target_cluster == "east"
    assert args.topic_config == ["retention.ms=7"] and args.delete_config == ["cleanup.policy"]
    # a file whose name holds "=" is still the topology file
    odd = tmp_path / "a=b.toml"
    odd.write_text("")
    args = parser.parse_args(["topics", "create", "t", "--config", str(odd), "--cluster", "east"])
    assert args.config == str(odd) and args.topic_config == []
    # elsewhere --config is only ever the topology file; --topology is its other name
    args = parser.parse_args(["topics", "list", "--topology", str(topology), "--cluster", "east"])
    assert args.config == str(topology)
    args = parser.parse_args(["acls", "list", "--bootstrap-server", "127.0.0.1:1"])
    assert args.bootstrap == "127.0.0.1:1"


def test_the_command_table_matches_the_modules() -> None:
    """`dcmirror --help` lists commands from deploy.cli.COMMANDS without importing their
    modules: each line there is the one its module registers, and every command is there."""
    from deploy import cli
    from deploy.demo import DEFAULT_RECORDS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert {name: text for name, (_, text) in cli.COMMANDS.items()} == {
        name: text for name, text in registered.items() if name not in ("broker", "demo")}
    for name, (module, _) in cli.COMMANDS.items():
        parser = build_parser(name)
        chosen = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        assert chosen._actions, (name, module)  # its own parser, not the listing's stub
    assert cli.DEMO_RECORDS == DEFAULT_RECORDS


def test_help_imports_no_command_module() -> None:
    code = ("import sys\nfrom deploy import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m == 'trio' or m.startswith(('cluster.client', 'topology', "
            "'deploy.')) and m not in ('deploy.cli',))\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert "usage: dcmirror" in out and "HEAVY []" in out, out


def test_a_command_runs_through_its_own_parser() -> None:
    from deploy import cli

    assert cli._command_word(["--log-level", "DEBUG", "topics", "list"]) == "topics"
    assert cli._command_word(["--help"]) == ""
    # an option's value that names another command does not confuse the choice
    args = build_parser(cli._command_word(["produce", "--topic", "status"])).parse_args(
        ["produce", "--topic", "status", "--bootstrap", "h:1"])
    assert args.command == "produce" and args.topic == "status" and args.func is not None


def test_warehouse_serve_load_interval_is_ascii_digits_within_bounds(capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    parser = build_parser("warehouse")
    args = parser.parse_args(["warehouse", "serve", "--config", "t.toml", "--load-interval-ms", "900000"])
    assert args.load_interval_ms == 900_000
    assert parser.parse_args(["warehouse", "serve", "--config", "t.toml"]).load_interval_ms is None
    for bad in ("²", "١٠٠٠", "-1000", "999", "604800001", "1e6", "99999999999999999999", ""):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["warehouse", "serve", "--config", "t.toml", "--load-interval-ms", bad])
        assert exited.value.code == 2
        assert "milliseconds from 1000 to 604800000 in ASCII digits" in capsys.readouterr().err, bad
