"""Every command and option of `dcmirror` says what it is for (issue 41: 61 options had no
help text), and `dcmirror --help` lists the commands by name."""

from __future__ import annotations

import argparse

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
