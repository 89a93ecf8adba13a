"""ACLs and the authorizer, with Kafka's codes and rules (StandardAuthorizer), sans-IO.

A binding says: principal P from host H may (ALLOW) or may not (DENY) do operation O on
resources of type T whose name equals N (LITERAL; "*" is every name) or starts with N
(PREFIXED). A request is allowed when the principal is a super user, or no DENY binding
matches and an ALLOW binding does. DENY wins. ALLOW of READ, WRITE, DELETE or ALTER implies
DESCRIBE; ALLOW of ALTER_CONFIGS implies DESCRIBE_CONFIGS; ALL covers every operation.
A resource with no binding at all is allowed only with `allow.everyone.if.no.acl.found`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from cluster.security.principal import KafkaPrincipal


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

# Operations each resource type knows (kafka-acls refuses the others).
OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
                                   AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
                                   AclOperation.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}),
    ResourceType.CLUSTER: frozenset({AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                                     AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                                     AclOperation.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({AclOperation.DESCRIBE, AclOperation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({AclOperation.DESCRIBE}),
    ResourceType.USER: frozenset({AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS}),
}

_IMPLIES: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                      AclOperation.DELETE, AclOperation.ALTER}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}),
}


class InvalidAcl(ValueError):
    """A binding that cannot be created (Kafka: INVALID_REQUEST with this message)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def validate(self) -> AclBinding:
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise InvalidAcl("an ACL needs a resource type (topic, group, cluster, transactional id, ...)")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl("an ACL's pattern type is LITERAL or PREFIXED")
        if self.operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise InvalidAcl("an ACL needs an operation")
        if self.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAcl("an ACL's permission is ALLOW or DENY")
        if not self.resource_name:
            raise InvalidAcl("an ACL needs a resource name")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise InvalidAcl(f"the cluster resource is named {CLUSTER_NAME!r}")
        if self.operation is not AclOperation.ALL and self.operation not in OPERATIONS[self.resource_type]:
            raise InvalidAcl(f"operation {self.operation.name} does not apply to {self.resource_type.name}")
        try:
            KafkaPrincipal.parse(self.principal)
        except ValueError as exc:
            raise InvalidAcl(str(exc)) from None
        if not self.host:
            raise InvalidAcl("an ACL needs a host ('*' for any)")
        return self

    def as_record(self) -> dict[str, object]:
        return {"resource_type": int(self.resource_type), "resource_name": self.resource_name,
                "pattern_type": int(self.pattern_type), "principal": self.principal, "host": self.host,
                "operation": int(self.operation), "permission": int(self.permission)}

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> AclBinding:
        return cls(ResourceType(int(r["resource_type"])), str(r["resource_name"]), PatternType(int(r["pattern_type"])),
                   str(r["principal"]), str(r["host"]), AclOperation(int(r["operation"])),
                   AclPermissionType(int(r["permission"])))

    def applies_to(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type is PatternType.LITERAL:
            return self.resource_name == name or self.resource_name == WILDCARD
        return name.startswith(self.resource_name)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls / DeleteAcls: None and ANY match everything."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if self.pattern_type is PatternType.MATCH:
            # every binding that would apply to the named resource
            if self.resource_name is not None and not (
                    (b.pattern_type is PatternType.LITERAL and b.resource_name in (self.resource_name, WILDCARD))
                    or (b.pattern_type is PatternType.PREFIXED and self.resource_name.startswith(b.resource_name))):
                return False
        else:
            if self.pattern_type is not PatternType.ANY and b.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and b.resource_name != self.resource_name:
                return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.operation is not AclOperation.ANY and b.operation != self.operation:
            return False
        return self.permission is AclPermissionType.ANY or b.permission == self.permission


class Authorizer:
    """Decides one (principal, host, operation, resource) at a time from the ACLs it holds."""

    def __init__(self, *, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_type: dict[ResourceType, list[AclBinding]] = {}

    def set_acls(self, bindings: Iterable[AclBinding]) -> None:
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for b in bindings:
            by_type.setdefault(b.resource_type, []).append(b)
        self._by_type = by_type

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        text = str(principal)
        if text in self.super_users:
            return True
        matching = [b for b in self._by_type.get(resource_type, ()) if b.applies_to(resource_type, name)]
        if not matching:
            return self.allow_everyone_if_no_acl_found
        allowed = False
        implied_by = _IMPLIES.get(operation, frozenset({operation}))
        for b in matching:
            if b.principal != text and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.host != WILDCARD and b.host != host:
                continue
            if b.permission is AclPermissionType.DENY:
                if b.operation is AclOperation.ALL or b.operation == operation:
                    return False
            elif b.operation is AclOperation.ALL or b.operation in implied_by:
                allowed = True
        return allowed

    def any_allowed(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                    resource_type: ResourceType) -> bool:
        """Some resource of the type allows the operation (Kafka's authorizeByResourceType,
        used for idempotent producers: WRITE on any topic, KIP-679)."""
        text = str(principal)
        if text in self.super_users:
            return True
        implied_by = _IMPLIES.get(operation, frozenset({operation}))
        for b in self._by_type.get(resource_type, ()):
            if (b.permission is AclPermissionType.ALLOW and b.principal in (text, WILDCARD_PRINCIPAL)
                    and b.host in (WILDCARD, host) and (b.operation is AclOperation.ALL or b.operation in implied_by)
                    and self.authorize(principal, host, operation, resource_type, b.resource_name)):
                return True
        return False

    def authorized_operations(self, principal: KafkaPrincipal, host: str, resource_type: ResourceType,
                              name: str) -> int:
        """The bit field of Metadata / DescribeCluster / DescribeGroups (KIP-430)."""
        bits = 0
        for op in OPERATIONS.get(resource_type, frozenset()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << int(op)
        return bits
