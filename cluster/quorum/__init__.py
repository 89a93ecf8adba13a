"""The metadata quorum: Raft (KRaft style) as a sans-IO core (raft.py), its durable state
(storage.py) and its trio driver (driver.py)."""
