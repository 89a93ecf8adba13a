"""The README's "Your own deployment" steps, run as written (issue 41): each line of that block
through bash with the `dcmirror` console script on PATH, from a fresh copy of the default
topology. `$EDITOR my.toml` is the one step a person does by hand: here an editor script
moves every loopback port to a free one (as `dcmirror demo` does), so the run never meets
another test's ports. `dcmirror up` runs in the background until it says ready; the record
`dcmirror produce` writes is then seen mirrored, loaded (through the warehouse service the
default topology runs) and counted by `warehouse sql`, and the web console answers."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import pids_with
from tests.harness import REPO

BIN = Path(sys.executable).parent
EDITOR = """\
import sys
from pathlib import Path
from deploy.demo import demo_topology_text
path = Path(sys.argv[1])
path.write_text(demo_topology_text(path.read_text()))
"""


def readme_steps() -> list[str]:
    """The command lines of the README's own-deployment block, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"Your own deployment.*?\n```\n(.*?)\n```", text, re.DOTALL)
    assert block is not None, "the README has no own-deployment block"
    steps = []
    for line in block.group(1).splitlines():
        command = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
        if command and not command.startswith("#"):
            steps.append(command)
    return steps


def test_the_readme_lists_the_steps_this_test_runs() -> None:
    words = [step.split()[0:3] for step in readme_steps()]
    assert words == [["cp", "topology/default.toml", "my.toml"], ["dcmirror", "dev-secrets", "--config"],
                     ["dcmirror", "topology", "check"], ["dcmirror", "up", "--config"],
                     ["echo", "'{\"user\":\"ann\",\"url\":\"/\"}'", "|"], ["dcmirror", "status", "--config"],
                     ["dcmirror", "load", "--config"], ["dcmirror", "warehouse", "sql"]], words


class Shell:
    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        # (the editor script beside, not in, the directory: its topology/ would shadow the package)
        self.env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1",
                        EDITOR=f"{sys.executable} {cwd.parent / 'editor.py'}")
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run(self, command: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)
        print(f"$ {command}   -> exit {proc.returncode} in {time.monotonic() - started:.1f} s")
        return proc

    def ok(self, command: str, timeout_s: float = 300) -> str:
        proc = self.run(command, timeout_s)
        assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc.stdout


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_the_readme_own_deployment_steps_work_as_written(tmp_path: Path) -> None:
    steps = readme_steps()
    work = tmp_path / "deployment"
    (work / "topology").mkdir(parents=True)
    shutil.copy(REPO / "topology" / "default.toml", work / "topology" / "default.toml")  # the repository's
    (tmp_path / "editor.py").write_text(EDITOR)
    sh = Shell(work)
    cp, dev_secrets, check, up_line, produce, status, load, sql = steps
    assert cp == "cp topology/default.toml my.toml && $EDITOR my.toml"
    sh.ok(cp)
    sh.ok(dev_secrets)
    described = sh.ok(check)
    assert "web console: http://127.0.0.1:" in described and "warehouse service" in described, described
    console = re.search(r"web console: (http://127\.0\.0\.1:\d+)/", described)
    assert console is not None

    log = (work / "up.log").open("w")
    up = subprocess.Popen(["bash", "-c", f"exec {up_line}"], cwd=work, env=sh.env, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while "dcmirror up: ready" not in (work / "up.log").read_text():
            assert up.poll() is None, f"dcmirror up exited {up.returncode}:\n{(work / 'up.log').read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"not ready:\n{(work / 'up.log').read_text()[-6000:]}"
            time.sleep(0.5)

        sh.ok(produce, 60)
        # The record mirrored into the aggregate (what status's lag and the load need).
        deadline = time.monotonic() + 120
        while True:
            seen = sh.run("dcmirror consume --config my.toml --cluster aggregate --topic east.pageviews -e "
                          "--format json", 60)
            values = [json.loads(line)["value"] for line in seen.stdout.splitlines() if line.startswith("{")]
            if seen.returncode == 0 and values == ['{"user":"ann","url":"/"}']:
                break
            assert time.monotonic() < deadline, f"not mirrored: {seen.stdout[-2000:]} {seen.stderr[-2000:]}"
            time.sleep(1)
        deadline = time.monotonic() + 120
        while (shown := sh.run(status, 60)).returncode != 0:
            assert shown.returncode == 1 and time.monotonic() < deadline, \
                f"status exited {shown.returncode}:\n{shown.stdout[-4000:]}\n{shown.stderr[-2000:]}"
            time.sleep(2)
        assert "HEALTHY" in shown.stdout or "healthy" in shown.stdout.lower(), shown.stdout

        loaded = sh.run(load, 600)
        assert loaded.returncode == 0, f"{loaded.stdout[-4000:]}\n{loaded.stderr[-4000:]}"
        assert "answered by the warehouse service" in loaded.stderr, loaded.stderr  # `up` runs it
        answer = sh.ok(sql, 300)
        # a table: the column's name, a rule, the one value, "(1 row)"
        lines = [line.strip() for line in answer.strip().splitlines()]
        assert lines[0] == "count(1)" and lines[-2:] == ["1", "(1 row)"], answer

        page = httpx.get(f"{console.group(1)}/", timeout=30, follow_redirects=True)
        assert page.status_code == 200 and "dcmirror" in page.text.lower(), page.status_code
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(30)
        log.close()
        left = pids_with(str(tmp_path))
        for pid in left:  # whatever a failed stop left
            os.kill(pid, signal.SIGKILL)
    said = (work / "up.log").read_text()
    print(said[-3000:])
    assert up.returncode == 0 and not left, (left, said[-6000:])
    # 9 brokers, 3 registries, 4 workers, the warehouse service and the console, each stopped
    assert "dcmirror up: stopped; all 18 processes exited cleanly" in said, said[-3000:]
