"""make peers (tests/peers/fetch.py) without the network: what a set's directory is checked
against, the POM it resolves with, and that a cache that does not match the lock is not used."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.peers import fetch
from tests.peers.fetch import PeerSet


def test_a_directory_is_checked_jar_by_jar_against_the_lock(tmp_path: Path) -> None:
    good, bad = b"good jar", b"tampered"
    (tmp_path / "a.jar").write_bytes(good)
    (tmp_path / "b.jar").write_bytes(bad)
    (tmp_path / "extra.jar").write_bytes(b"x")
    peer = PeerSet("s", ("g:a:1",), (), {"a.jar": hashlib.sha256(good).hexdigest(),
                                         "b.jar": hashlib.sha256(b"original").hexdigest(),
                                         "c.jar": "0" * 64})
    problems = fetch.check(peer, tmp_path)
    assert problems[0] == "extra.jar is not in the lock" and problems[1] == "c.jar is missing"
    assert problems[2].startswith("b.jar: sha256 ") and len(problems) == 3


def test_the_pom_pins_versions_and_exclusions() -> None:
    peer = PeerSet("s", ("org.x:y:1.2",), ("org.z:*",), {})
    pom = fetch._pom(peer)
    assert "<groupId>org.x</groupId><artifactId>y</artifactId><version>1.2</version>" in pom
    assert "<exclusion><groupId>org.z</groupId><artifactId>*</artifactId></exclusion>" in pom


def test_the_pinned_file_names_kafka_4_and_a_sum_for_every_jar() -> None:
    sets = fetch.load_sets()
    assert fetch.version_of(sets["kafka"], "org.apache.kafka:kafka_2.13").startswith("4.")
    for peer in sets.values():
        assert peer.sha256 and all(len(s) == 64 for s in peer.sha256.values()), peer.name


def test_an_unfetched_set_says_to_run_make_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DCMIRROR_PEERS_DIR", str(tmp_path))
    with pytest.raises(fetch.PeersError, match="make peers"):
        fetch.set_dir("kafka")
