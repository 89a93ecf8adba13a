"""Security: who a connection is (TLS, SASL) and what it may do (ACLs).

    principal.py  KafkaPrincipal and ssl.principal.mapping.rules
    scram.py      SCRAM credentials and both sides of the exchange (sans-IO)
    sasl.py       a connection's SASL state on the broker, PLAIN and SCRAM (sans-IO)
    acl.py        ACL bindings and the authorizer (Kafka's StandardAuthorizer rules, sans-IO)
    tls.py        SSL contexts from Kafka's ssl.* settings, certificate checks
    listeners.py  listeners, advertised.listeners, listener.security.protocol.map
    connector.py  the client side of every link: TCP, TLS, SASL (trio)
"""
