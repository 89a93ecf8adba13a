"""Who sent a request: the connection's session, and what each handler sees of it."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.protocol.sentinels import AUTHORIZED_OPERATIONS_OMITTED
from cluster.security.acl import CLUSTER_NAME, AclOperation, Authorizer, ResourceType
from cluster.security.principal import ANONYMOUS, KafkaPrincipal
from cluster.security.sasl import SaslServerSession

# The operations each resource type has (Kafka's AclEntry.supportedOperations): what
# Metadata, DescribeCluster and DescribeGroups report as authorized operations.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                         AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                           AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
}


@dataclass(slots=True)
class Session:
    """One connection's security state (the server creates it, the router updates it)."""

    listener: str = "PLAINTEXT"
    protocol: str = "PLAINTEXT"
    client_ip: str = ""
    principal: KafkaPrincipal = ANONYMOUS  # the TLS principal until SASL authenticates
    sasl: SaslServerSession | None = None  # None: not a SASL listener
    # Set when a login failed: the server sends the answer, waits this long and closes.
    close_after_s: float | None = None

    @property
    def authenticated(self) -> bool:
        return self.sasl is None or self.sasl.authenticated


PLAINTEXT_SESSION = Session()


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What handlers see: the client's id and host (JoinGroup, DescribeGroups report them),
    its principal and listener, and the authorizer (None: no authorization configured)."""

    client_id: str
    client_host: str
    principal: KafkaPrincipal = ANONYMOUS
    listener: str = "PLAINTEXT"
    authorizer: Authorizer | None = None
    connection: object = None
    """The client's connection (its session object): share sessions end with it."""

    @property
    def client_ip(self) -> str:
        return self.client_host.lstrip("/")

    def allowed(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        if self.authorizer is None:
            return True
        return self.authorizer.authorize(self.principal, self.client_ip, operation, resource_type, name)

    def allowed_on_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        if self.authorizer is None:
            return True
        return self.authorizer.any_allowed(self.principal, self.client_ip, operation, resource_type)

    def allowed_on_cluster(self, operation: AclOperation) -> bool:
        return self.allowed(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def authorized_operations(self, resource_type: ResourceType, name: str, *, asked: bool) -> int:
        """The bit field Kafka answers when a client asks for the operations it may perform on
        a resource (bit n: AclOperation n); every supported one without an authorizer. Not
        asked: Kafka's "omitted" value."""
        if not asked:
            return AUTHORIZED_OPERATIONS_OMITTED
        bits = 0
        for operation in SUPPORTED_OPERATIONS[resource_type]:
            if self.allowed(operation, resource_type, name):
                bits |= 1 << operation
        return bits
