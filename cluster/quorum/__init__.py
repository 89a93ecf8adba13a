"""Metadata quorum: Raft (KRaft style) as a sans-IO core; trio driver to come."""
