"""`make peers`: the pinned Apache Kafka, MirrorMaker 2 and Spark Kafka connector jars from
Maven Central into a cache outside the repository, checked against the checksums pinned in
tests/peers/peers.toml.

    python -m tests.peers.fetch            fetch what is missing (nothing when the cache is warm)
    python -m tests.peers.fetch --offline  use the cache and Maven's local repository only
    python -m tests.peers.fetch --lock     resolve again and write every jar's sha256 into peers.toml

Each set (`[sets.NAME]` in peers.toml: Maven coordinates and exclusions) is resolved with its
transitive dependencies by Maven (`dependency:copy-dependencies`, every repository a POM
names redirected to Maven Central) into a staging directory; every jar there must be one the
lock names, with its sha256, and every jar the lock names must be there; only then does the
staging directory become the set's directory in the cache. A warm cache is checked the same
way and fetches nothing. No jar is ever committed.

The cache: $DCMIRROR_PEERS_DIR, else ~/.cache/dcmirror/peers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

PINNED = Path(__file__).with_name("peers.toml")
CENTRAL = "https://repo.maven.apache.org/maven2"
MAVEN_TIMEOUT_S = 900


class PeersError(Exception):
    """A set could not be fetched or does not match its pinned checksums."""


@dataclass(frozen=True)
class PeerSet:
    name: str
    artifacts: tuple[str, ...]  # group:artifact:version
    exclude: tuple[str, ...]  # group:artifact ("*" allowed), left out with their dependencies
    sha256: dict[str, str]  # jar file name -> sha256

    @property
    def key(self) -> str:
        """The set's directory name: changes with what it pins."""
        digest = hashlib.sha256(repr((self.artifacts, self.exclude, sorted(self.sha256.items()))).encode())
        return f"{self.name}-{digest.hexdigest()[:12]}"


def cache_dir() -> Path:
    return Path(os.environ.get("DCMIRROR_PEERS_DIR") or Path.home() / ".cache" / "dcmirror" / "peers")


def load_sets(path: Path = PINNED) -> dict[str, PeerSet]:
    doc = tomllib.loads(path.read_text())
    out = {}
    for name, table in doc.get("sets", {}).items():
        out[name] = PeerSet(name, tuple(table["artifacts"]), tuple(table.get("exclude", ())),
                            dict(table.get("sha256", {})))
    return out


def version_of(peer: PeerSet, group_artifact: str) -> str:
    """The pinned version of `group:artifact` in the set."""
    for coordinates in peer.artifacts:
        group, artifact, version = coordinates.split(":")
        if f"{group}:{artifact}" == group_artifact:
            return version
    raise KeyError(f"{group_artifact} is not pinned in set {peer.name}")


def set_dir(name: str) -> Path:
    """The directory of a fetched, checked set (PeersError if it is not there: run make peers)."""
    peer = load_sets()[name]
    path = cache_dir() / peer.key
    if not (path / ".complete").exists():
        raise PeersError(f"the {name} peers are not fetched ({path} is missing): run `make peers`")
    return path


def classpath(name: str) -> str:
    return str(set_dir(name) / "*")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check(peer: PeerSet, directory: Path) -> list[str]:
    """What is wrong with `directory` against the set's lock (nothing: [])."""
    problems = []
    found = {p.name for p in directory.glob("*.jar")}
    for name in sorted(found - set(peer.sha256)):
        problems.append(f"{name} is not in the lock")
    for name in sorted(set(peer.sha256) - found):
        problems.append(f"{name} is missing")
    for name in sorted(found & set(peer.sha256)):
        got = _sha256(directory / name)
        if got != peer.sha256[name]:
            problems.append(f"{name}: sha256 {got}, pinned {peer.sha256[name]}")
    return problems


def _pom(peer: PeerSet) -> str:
    deps = []
    for coordinates in peer.artifacts:
        group, artifact, version = coordinates.split(":")
        exclusions = "".join(
            f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
            for g, a in (e.split(":") for e in peer.exclude))
        deps.append(f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
                    f"<version>{version}</version><exclusions>{exclusions}</exclusions></dependency>")
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>dcmirror.peers</groupId><artifactId>{peer.name}</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>\n")


SETTINGS = f"""<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>{CENTRAL}</url>
</mirror></mirrors></settings>
"""


def resolve(peer: PeerSet, into: Path, *, offline: bool) -> None:
    """The set's jars and their dependencies into `into`, by Maven."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeersError("Maven (mvn) is not installed: `make sysdeps` installs it")
    with tempfile.TemporaryDirectory(prefix=f"peers-{peer.name}-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_pom(peer))
        (work / "settings.xml").write_text(SETTINGS)
        cmd = [mvn, "-q", "-B", "-s", str(work / "settings.xml"), f"-Dmaven.repo.local={cache_dir() / 'm2'}",
               "dependency:copy-dependencies", f"-DoutputDirectory={into}", "-DincludeScope=runtime"]
        if offline:
            cmd.insert(1, "-o")
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S)
        if proc.returncode != 0:
            errors = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "ERROR" in line]
            raise PeersError(f"Maven could not resolve the {peer.name} peers ({', '.join(peer.artifacts)}):\n"
                             + "\n".join(errors[:8] or [proc.stdout[-2000:], proc.stderr[-2000:]]))


def fetch(peer: PeerSet, *, offline: bool = False) -> tuple[Path, bool]:
    """The set's checked directory, and whether anything was fetched."""
    dest = cache_dir() / peer.key
    if (dest / ".complete").exists():
        problems = check(peer, dest)
        if not problems:
            return dest, False
        print(f"peers: {dest} does not match the lock ({problems[0]}); fetching it again", flush=True)
        shutil.rmtree(dest)
    cache_dir().mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{peer.name}-", dir=cache_dir()))
    try:
        resolve(peer, staging, offline=offline)
        problems = check(peer, staging)
        if problems:
            raise PeersError(f"the {peer.name} peers Maven resolved do not match tests/peers/peers.toml:\n  "
                             + "\n  ".join(problems[:20]))
        (staging / ".complete").write_text("\n".join(peer.artifacts) + "\n")
        staging.rename(dest)
        for old in cache_dir().glob(f"{peer.name}-*"):
            if old != dest and (old / ".complete").exists():
                shutil.rmtree(old)  # an earlier pin of this set
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return dest, True


def write_lock(sets: dict[str, PeerSet], path: Path = PINNED) -> None:
    """Resolve every set and pin what came (the maintainer's step when a version changes)."""
    text = path.read_text()
    header = text.split("[sets.", 1)[0]
    out = [header.rstrip() + "\n"]
    for peer in sets.values():
        with tempfile.TemporaryDirectory() as tmp:
            resolve(peer, Path(tmp), offline=False)
            sums = {p.name: _sha256(p) for p in sorted(Path(tmp).glob("*.jar"))}
        out.append(f"\n[sets.{peer.name}]\nartifacts = [\n" + "".join(f'  "{a}",\n' for a in peer.artifacts) + "]\n")
        out.append("exclude = [" + ", ".join(f'"{e}"' for e in peer.exclude) + "]\n")
        out.append(f"\n[sets.{peer.name}.sha256]\n" + "".join(f'"{n}" = "{s}"\n' for n, s in sums.items()))
    path.write_text("".join(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.peers.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--offline", action="store_true", help="the cache and Maven's local repository only")
    parser.add_argument("--lock", action="store_true", help="resolve again and pin every jar's sha256")
    args = parser.parse_args(argv)
    sets = load_sets()
    try:
        if args.lock:
            write_lock(sets)
            print(f"peers: pinned {', '.join(sets)} in {PINNED}")
            return 0
        for peer in sets.values():
            started = time.monotonic()
            path, fetched = fetch(peer, offline=args.offline)
            size_mb = sum(p.stat().st_size for p in path.glob("*.jar")) / 1e6
            print(f"peers: {peer.name}: {len(peer.sha256)} jars, {size_mb:.0f} MB in {path}"
                  + (f" (fetched in {time.monotonic() - started:.1f} s)" if fetched else " (cached)"), flush=True)
    except (PeersError, subprocess.TimeoutExpired) as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
