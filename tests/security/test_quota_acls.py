"""Client quotas under the authorizer: DESCRIBE_CONFIGS on the cluster to describe them,
ALTER_CONFIGS to change them (Kafka's rule), and a `user` quota applies to the SASL
principal of that name."""

from __future__ import annotations

import time
from pathlib import Path

from tests.interop.clients import QuotaAdmin
from tests.security.secured import ClientSecurity, add_users, create_acls, start_secured_broker

DENIED = (31, "Cluster authorization failed.")


def test_quota_apis_need_cluster_config_acls_and_user_quotas_follow_the_principal(tmp_path: Path) -> None:
    broker = start_secured_broker(tmp_path)
    try:
        add_users(broker.internal)
        alice_conf = ClientSecurity(broker, "SCRAM-SHA-256", "alice").kafka_python()
        alice = QuotaAdmin(alice_conf.pop("bootstrap_servers"), **alice_conf)
        try:
            assert alice.describe([])[:2] == DENIED
            assert alice.alter([({"user": "alice"}, {"request_percentage": 0.5})]) == [DENIED]
            create_acls({"bootstrap.servers": broker.internal},
                        [("BROKER", "kafka-cluster", "LITERAL", "User:alice", "DESCRIBE_CONFIGS", "ALLOW")])
            assert alice.describe([]) == (0, None, {})
            assert alice.alter([({"user": "alice"}, {"request_percentage": 0.5})]) == [DENIED]
            create_acls({"bootstrap.servers": broker.internal},
                        [("BROKER", "kafka-cluster", "LITERAL", "User:alice", "ALTER_CONFIGS", "ALLOW")])
            assert alice.alter([({"user": "alice"}, {"request_percentage": 0.01})]) == [(0, None)]
            # alice's own requests now count against 0.01 % of a handler (0.1 ms a second); admin's
            # do not. The bound is far below what any request loop uses, however slow the
            # machine makes the client (at 0.5 % a client slowed by a loaded CI machine asked
            # too seldom to cross it in 3,000 requests); the wait ends at the first throttle.
            admin_conf = ClientSecurity(broker, "SCRAM-SHA-256", "admin").kafka_python()
            admin = QuotaAdmin(admin_conf.pop("bootstrap_servers"), **admin_conf)
            try:
                deadline = time.monotonic() + 120
                asked = 0
                while alice.last_throttle_ms == 0 and time.monotonic() < deadline:
                    alice.describe([])
                    asked += 1
                assert alice.last_throttle_ms > 0, f"alice was never throttled ({asked} requests)"
                print(f"alice throttled after {asked} requests")
                for _ in range(50):
                    admin.describe([])
                    assert admin.last_throttle_ms == 0
            finally:
                admin.close()
        finally:
            alice.close()
    finally:
        broker.proc.stop()
