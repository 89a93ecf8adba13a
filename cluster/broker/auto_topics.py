"""Topics created on first use by Metadata (auto.create.topics.enable), as Kafka's
AutoTopicCreationManager does: through the controller, with the broker's defaults."""

from __future__ import annotations

import logging

from cluster.broker.context import RequestContext
from cluster.broker.controller_channel import ControllerChannel, ControllerUnavailable
from cluster.broker.metadata_cache import MetadataCache
from cluster.controller.image import TopicImage
from cluster.protocol.errors import ErrorCode
from cluster.protocol.topic_names import InvalidTopic, validate_topic_name
from cluster.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)


class AutoTopicCreation:
    def __init__(self, cache: MetadataCache, controller: ControllerChannel, *, enabled: bool) -> None:
        self.cache = cache
        self.controller = controller
        self.enabled = enabled

    async def topic(self, name: str, ctx: RequestContext | None = None) -> tuple[TopicImage | None, int]:
        """(topic, error) for a reference to a topic that may not exist yet; creating it
        needs CREATE on the cluster or the topic (as in Kafka)."""
        t = self.cache.image.topic(name)
        if t is not None:
            return t, ErrorCode.none
        try:
            validate_topic_name(name)
        except InvalidTopic:
            return None, ErrorCode.invalid_topic_exception
        if not self.enabled:
            return None, ErrorCode.unknown_topic_or_partition
        if ctx is not None and not (ctx.allowed_on_cluster(AclOperation.CREATE)
                                    or ctx.allowed(AclOperation.CREATE, ResourceType.TOPIC, name)):
            return None, ErrorCode.unknown_topic_or_partition
        try:
            results = await self.controller.create_topics([{"name": name, "num_partitions": -1,
                                                            "replication_factor": -1}])
        except ControllerUnavailable as exc:
            log.warning("auto-creating topic %s failed: %s", name, exc)
            return None, ErrorCode.leader_not_available
        code = results[0]["error_code"]
        if code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            log.warning("auto-creating topic %s failed: %s", name, results[0].get("error_message"))
            return None, ErrorCode.invalid_topic_exception if code == ErrorCode.invalid_topic_exception else code
        return self.cache.image.topic(name), ErrorCode.none
