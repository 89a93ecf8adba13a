"""Cluster feature levels (KIP-584): what this code supports and what a cluster finalized.

`metadata.version` 21 is Kafka's 3.9-IV0, the client protocol these brokers follow (this
metadata log is not Kafka's, so nothing upgrades it); `kraft.version` 0 is a static voter
set (controller.quorum.voters); `group.version` 1 is KIP-848 consumer groups;
`transaction.version` stays 0: at 2 Kafka 4's Java producer switches to KIP-890 part 2
transactions (an epoch bump per transaction, EndTxn v5), which these brokers do not speak.
Those four are fixed. `eligible.leader.replicas.version` (KIP-966) is the one a cluster
changes: FeatureLevel records in the metadata log finalize it; a new cluster starts at 1
(as Kafka 4.1's do), a cluster whose log predates it stays at 0 until UpdateFeatures
(`kafka-features upgrade --feature eligible.leader.replicas.version=1`,
`dcmirror features upgrade ...`) raises it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.controller.image import ELR_FEATURE

if TYPE_CHECKING:
    from cluster.controller.image import MetadataImage

# name -> (supported min level, supported max level)
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {
    ELR_FEATURE: (0, 1),
    "group.version": (0, 1),
    "kraft.version": (0, 0),
    "metadata.version": (21, 21),
    "transaction.version": (0, 0),
}
# Levels nothing changes here.
FIXED_LEVELS: dict[str, int] = {"group.version": 1, "kraft.version": 0, "metadata.version": 21,
                                "transaction.version": 0}
# What a new cluster's metadata log starts with (overridable by bootstrap FeatureLevel records).
NEW_CLUSTER_LEVELS: dict[str, int] = {ELR_FEATURE: 1}

# UpdateFeatures upgrade types (KIP-778)
UPGRADE = 1
SAFE_DOWNGRADE = 2
UNSAFE_DOWNGRADE = 3


def finalized_levels(image: MetadataImage) -> dict[str, int]:
    """Every feature's finalized level (0 when not finalized)."""
    levels = {name: 0 for name in SUPPORTED_FEATURES}
    levels.update(FIXED_LEVELS)
    levels.update({name: level for name, level in image.features.items() if name in SUPPORTED_FEATURES})
    return levels
