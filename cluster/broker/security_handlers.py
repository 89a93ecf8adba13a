"""SASL (SaslHandshake, SaslAuthenticate), SCRAM users (Describe/AlterUserScramCredentials)
and ACLs (Create/Describe/DeleteAcls).

SASL requests change the connection's session, so the router hands them the session; the
others are ordinary handlers. Credentials and ACLs are stored in the metadata log by the
controller; a broker answers reads from its own image.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from cluster.broker.context import RequestContext, Session
from cluster.broker.controller_channel import ControllerChannel, ControllerUnavailable
from cluster.broker.security import BrokerSecurity
from cluster.common.clock import Clock
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermissionType,
    InvalidAcl,
    PatternType,
    ResourceType,
)
from cluster.security.errors import AuthenticationFailed
from cluster.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_TYPES,
    MIN_ITERATIONS,
    credential_from_salted,
)

log = logging.getLogger(__name__)

_MECHANISM_NAMES = {v: k for k, v in MECHANISM_TYPES.items()}
MAX_USER_NAME_CHARS = 256
MAX_ACLS_PER_REQUEST = 1000  # ACLs or credential changes: each becomes a record of one controller entry


class SaslHandlers:
    def __init__(self, security: BrokerSecurity, clock: Clock) -> None:
        self.security = security
        self.clock = clock

    def handshake(self, version: int, req: Any, session: Session) -> dict[str, Any]:
        if session.sasl is None:
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
        try:
            ok = session.sasl.handshake(req.mechanism, version)
        except AuthenticationFailed as exc:
            log.info("SASL handshake from %s refused: %s", session.client_ip, exc)
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": list(session.sasl.enabled_mechanisms)}
        return {"error_code": ErrorCode.none if ok else ErrorCode.unsupported_sasl_mechanism,
                "mechanisms": list(session.sasl.enabled_mechanisms)}

    def authenticate(self, token: bytes, session: Session) -> tuple[int, str | None, bytes, int]:
        """(error code, error message, reply token, session lifetime ms)."""
        assert session.sasl is not None
        now_ms = self.clock.now_ms()
        try:
            reply = session.sasl.authenticate(token, now_ms)
        except AuthenticationFailed as exc:
            delay_s = self.security.login_failed(session.client_ip)
            session.close_after_s = delay_s
            mechanism = session.sasl.mechanism or "?"
            # The reason is logged (it never holds the password); the client gets Kafka's text.
            log.warning("failed SASL %s login from %s on %s: %s", mechanism, session.client_ip, session.listener, exc)
            return (ErrorCode.sasl_authentication_failed,
                    f"Authentication failed during authentication due to invalid credentials with SASL "
                    f"mechanism {mechanism}", b"", 0)
        if session.sasl.authenticated and session.sasl.state == "done":
            if session.principal != session.sasl.principal:
                log.info("%s authenticated as %s (SASL %s) on %s", session.client_ip, session.sasl.principal,
                         session.sasl.mechanism, session.listener)
            assert session.sasl.principal is not None
            session.principal = session.sasl.principal
            self.security.login_succeeded(session.client_ip)
        return ErrorCode.none, None, reply, session.sasl.session_lifetime_ms(now_ms)


class ScramUserHandlers:
    def __init__(self, security: BrokerSecurity, controller: ControllerChannel) -> None:
        self.security = security
        self.controller = controller

    async def handle_describe_user_scram_credentials(self, version: int, req: Any,
                                                     ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": "DESCRIBE on the cluster is needed", "results": []}
        store = self.security.scram_store()
        names = sorted({n for n, _ in store}) if not req.users else [u.name for u in req.users]  # null or []: all
        # As Kafka's ScramImage.describe: one result per user named, DUPLICATE_RESOURCE for one
        # named more than once.
        counts = collections.Counter(names)
        results: list[dict[str, Any]] = []
        for name in dict.fromkeys(names):
            if counts[name] > 1:
                results.append({"user": name, "error_code": ErrorCode.duplicate_resource,
                                "error_message": f"user {name} is asked for twice", "credential_infos": []})
                continue
            infos = [{"mechanism": MECHANISM_TYPES[m], "iterations": int(c["iterations"])}
                     for (n, m), c in sorted(store.items()) if n == name]
            if not infos:
                results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                                "error_message": f"user {name} has no SCRAM credential", "credential_infos": []})
            else:
                results.append({"user": name, "error_code": ErrorCode.none, "error_message": None,
                                "credential_infos": infos})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}

    async def handle_alter_user_scram_credentials(self, version: int, req: Any,
                                                  ctx: RequestContext) -> dict[str, Any]:
        users = {d.name for d in req.deletions} | {u.name for u in req.upsertions}
        if not ctx.allowed_on_cluster(AclOperation.ALTER):
            return {"throttle_time": 0, "results": [
                {"user": u, "error_code": ErrorCode.cluster_authorization_failed,
                 "error_message": "ALTER on the cluster is needed"} for u in sorted(users)]}
        if len(req.deletions) + len(req.upsertions) > MAX_ACLS_PER_REQUEST:
            return {"throttle_time": 0, "results": [
                {"user": u, "error_code": ErrorCode.invalid_request,
                 "error_message": f"at most {MAX_ACLS_PER_REQUEST} credential changes per request"}
                for u in sorted(users)]}
        errors: dict[str, tuple[int, str]] = {}
        seen: set[tuple[str, int]] = set()
        for item in [*req.deletions, *req.upsertions]:
            key = (item.name, item.mechanism)
            if key in seen:
                errors.setdefault(item.name, (ErrorCode.duplicate_resource,
                                              "a user and mechanism appear twice in one request"))
            seen.add(key)
            if not item.name or len(item.name) > MAX_USER_NAME_CHARS:
                errors.setdefault(item.name, (ErrorCode.unacceptable_credential, "bad user name"))
            if item.mechanism not in _MECHANISM_NAMES:
                errors.setdefault(item.name, (ErrorCode.unsupported_sasl_mechanism,
                                              f"unknown SCRAM mechanism {item.mechanism}"))
        upsertions = []
        for u in req.upsertions:
            if u.name in errors:
                continue
            if not MIN_ITERATIONS <= u.iterations <= MAX_ITERATIONS:
                errors[u.name] = (ErrorCode.unacceptable_credential,
                                  f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}")
                continue
            if not u.salt or not u.salted_password:
                errors[u.name] = (ErrorCode.unacceptable_credential, "salt and salted password must not be empty")
                continue
            c = credential_from_salted(_MECHANISM_NAMES[u.mechanism], bytes(u.salted_password), bytes(u.salt),
                                       int(u.iterations))
            upsertions.append({"name": u.name, **c.record_fields()})
        deletions = [{"name": d.name, "mechanism": _MECHANISM_NAMES[d.mechanism]} for d in req.deletions
                     if d.name not in errors]
        results: dict[str, dict[str, Any]] = {
            u: {"user": u, "error_code": code, "error_message": msg} for u, (code, msg) in errors.items()}
        if deletions or upsertions:
            try:
                answer = await self.controller.call("alter_scram", {"deletions": deletions, "upsertions": upsertions})
            except ControllerUnavailable as exc:
                answer = {"error_code": ErrorCode.request_timed_out, "error_message": str(exc)}
            if answer["error_code"] != ErrorCode.none:
                for u in {x["name"] for x in deletions + upsertions}:
                    results[u] = {"user": u, "error_code": answer["error_code"],
                                  "error_message": answer.get("error_message")}
            else:
                for r in answer["results"]:
                    prior = results.get(r["name"])
                    if prior is None or prior["error_code"] == ErrorCode.none:
                        results[r["name"]] = {"user": r["name"], "error_code": r["error_code"],
                                              "error_message": r["error_message"]}
        for u in users:
            results.setdefault(u, {"user": u, "error_code": ErrorCode.none, "error_message": None})
        return {"throttle_time": 0, "results": [results[u] for u in sorted(results)]}


class AclHandlers:
    def __init__(self, security: BrokerSecurity, controller: ControllerChannel) -> None:
        self.security = security
        self.controller = controller

    def _bindings(self) -> dict[str, AclBinding]:
        return {i: AclBinding.from_record(a) for i, a in self.security.acl_store().items()}

    def _refused(self) -> str | None:
        if self.security.authorizer() is None:
            return "no authorizer is configured (authorizer.class.name)"
        return None

    async def handle_describe_acls(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        def answer(code: int, message: str | None, resources: list[dict[str, Any]]) -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": code, "error_message": message, "resources": resources}

        if (why := self._refused()) is not None:
            return answer(ErrorCode.security_disabled, why, [])
        if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
            return answer(ErrorCode.cluster_authorization_failed, "DESCRIBE on the cluster is needed", [])
        try:
            f = _acl_filter(req)
        except ValueError as exc:
            return answer(ErrorCode.invalid_request, f"bad ACL filter: {exc}", [])
        grouped: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for b in sorted(self._bindings().values(), key=_sort_key):
            if f.matches(b):
                grouped.setdefault((int(b.resource_type), b.resource_name, int(b.pattern_type)), []).append(
                    {"principal": b.principal, "host": b.host, "operation": int(b.operation),
                     "permission_type": int(b.permission)})
        return answer(ErrorCode.none, None, [
            {"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
            for (rt, name, pt), acls in grouped.items()])

    async def handle_create_acls(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        def all_failed(code: int, message: str) -> dict[str, Any]:
            return {"throttle_time": 0, "results": [{"error_code": code, "error_message": message}
                                                    for _ in req.creations]}

        if (why := self._refused()) is not None:
            return all_failed(ErrorCode.security_disabled, why)
        if not ctx.allowed_on_cluster(AclOperation.ALTER):
            return all_failed(ErrorCode.cluster_authorization_failed, "ALTER on the cluster is needed")
        if len(req.creations) > MAX_ACLS_PER_REQUEST:
            return all_failed(ErrorCode.invalid_request, f"at most {MAX_ACLS_PER_REQUEST} ACLs per request")
        results: list[dict[str, Any]] = []
        valid = []
        for c in req.creations:
            try:
                b = AclBinding(ResourceType(c.resource_type), c.resource_name,
                               PatternType(getattr(c, "resource_pattern_type", PatternType.LITERAL)), c.principal,
                               c.host, AclOperation(c.operation), AclPermissionType(c.permission_type)).validate()
            except (InvalidAcl, ValueError) as exc:
                results.append({"error_code": ErrorCode.invalid_request, "error_message": str(exc)})
                continue
            results.append({"error_code": ErrorCode.none, "error_message": None})
            valid.append(b.as_record())
        if valid:
            try:
                answer = await self.controller.call("create_acls", {"acls": valid})
            except ControllerUnavailable as exc:
                answer = {"error_code": ErrorCode.request_timed_out, "error_message": str(exc)}
            if answer["error_code"] != ErrorCode.none:
                for r in results:
                    if r["error_code"] == ErrorCode.none:
                        r.update(error_code=answer["error_code"], error_message=answer.get("error_message"))
        return {"throttle_time": 0, "results": results}

    async def handle_delete_acls(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        def all_failed(code: int, message: str) -> dict[str, Any]:
            return {"throttle_time": 0, "filter_results": [
                {"error_code": code, "error_message": message, "matching_acls": []} for _ in req.filters]}

        if (why := self._refused()) is not None:
            return all_failed(ErrorCode.security_disabled, why)
        if not ctx.allowed_on_cluster(AclOperation.ALTER):
            return all_failed(ErrorCode.cluster_authorization_failed, "ALTER on the cluster is needed")
        bindings = self._bindings()
        results = []
        ids: list[str] = []
        for raw in req.filters:
            try:
                f = _acl_filter(raw)
            except ValueError as exc:
                results.append({"error_code": ErrorCode.invalid_request, "error_message": f"bad ACL filter: {exc}",
                                "matching_acls": []})
                continue
            matched = sorted(((i, b) for i, b in bindings.items() if f.matches(b)), key=lambda ib: _sort_key(ib[1]))
            ids.extend(i for i, _ in matched)
            results.append({"error_code": ErrorCode.none, "error_message": None, "matching_acls": [
                {"error_code": ErrorCode.none, "error_message": None, "resource_type": int(b.resource_type),
                 "resource_name": b.resource_name, "pattern_type": int(b.pattern_type), "principal": b.principal,
                 "host": b.host, "operation": int(b.operation), "permission_type": int(b.permission)}
                for _, b in matched]})
        if ids:
            try:
                answer = await self.controller.call("delete_acls", {"ids": sorted(set(ids))})
            except ControllerUnavailable as exc:
                answer = {"error_code": ErrorCode.request_timed_out, "error_message": str(exc)}
            if answer["error_code"] != ErrorCode.none:
                return all_failed(answer["error_code"], str(answer.get("error_message")))
        return {"throttle_time": 0, "filter_results": results}


def _acl_filter(raw: Any) -> AclFilter:
    """A DescribeAcls request or a DeleteAcls filter (v0 has no pattern type: LITERAL)."""
    return AclFilter(ResourceType(raw.resource_type_filter), raw.resource_name_filter,
                     PatternType(getattr(raw, "pattern_type_filter", PatternType.LITERAL)), raw.principal_filter,
                     raw.host_filter, AclOperation(raw.operation), AclPermissionType(raw.permission_type))


def _sort_key(b: AclBinding) -> tuple[Any, ...]:
    return (int(b.resource_type), b.resource_name, int(b.pattern_type), b.principal, b.host, int(b.operation),
            int(b.permission))

