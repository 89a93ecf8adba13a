"""The registry's primary choice (cluster/registry/election.py), sans-IO."""

from __future__ import annotations

from cluster.registry.election import Candidate, choose_primary, member_metadata, parse_member


def test_lowest_eligible_url_without_a_current_primary() -> None:
    members = [Candidate("m1", "http://b:1", True, None), Candidate("m2", "http://a:1", True, None),
               Candidate("m3", "http://0:1", False, None)]
    assert choose_primary(members) == "http://a:1"
    assert choose_primary([Candidate("m3", "http://0:1", False, None)]) is None
    assert choose_primary([]) is None


def test_the_current_primary_stays_while_it_is_a_member() -> None:
    members = [Candidate("m1", "http://b:1", True, "http://b:1"), Candidate("m2", "http://c:1", True, "http://b:1"),
               Candidate("m3", "http://a:1", True, None)]          # a new instance with a lower URL
    assert choose_primary(members) == "http://b:1"
    # the followed primary left: the lowest eligible URL among those present
    gone = [Candidate("m2", "http://c:1", True, "http://b:1"), Candidate("m3", "http://a:1", True, None)]
    assert choose_primary(gone) == "http://a:1"


def test_member_metadata_round_trip_and_garbage() -> None:
    raw = member_metadata("http://a:1", True, "http://b:1")
    assert parse_member("m", raw) == Candidate("m", "http://a:1", True, "http://b:1")
    assert parse_member("m", b"not json") is None
    assert parse_member("m", b"{}") is None
    assert parse_member("m", b" " * 5000) is None
