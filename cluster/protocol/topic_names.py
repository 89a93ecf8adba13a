"""Legal topic names, as Kafka's `Topic.validate` has them (any client may send any string)."""

from __future__ import annotations

import re

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249


class InvalidTopic(ValueError):
    pass


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise InvalidTopic(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopic(f"topic name is {len(name)} characters, longer than {MAX_TOPIC_NAME_LENGTH}")
    if not _LEGAL_TOPIC.match(name):
        raise InvalidTopic(f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'")
