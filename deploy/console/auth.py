"""Who is using the console and what they may do.

Two ways in, both checked against something the deployment already trusts:
- SCRAM (the cluster's own users): the name and password are tried against every cluster
  whose client listener speaks SASL; the user is logged in where a cluster accepted them,
  and the record browser and every action run as that user, so the brokers' ACLs decide.
- The console's bearer token (`[console] auth_token`, a reference): the console's admin,
  acting with the topology's client credentials.
A topology with neither (no SASL listener, no token) has an open console, which then must
bind to loopback (checked at start).

Sessions live in this process only: a random id in an HttpOnly, SameSite=Strict cookie
(Secure under HTTPS), an absolute and an idle expiry, a CSRF token per session that every
POST must carry. Passwords are held as Secret (never printed, never in a page) for the
session's life, since every action needs them again; logging out forgets them.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from cluster.common.secrets import Secret

COOKIE = "dcmirror_console"
SESSION_IDLE_S = 30 * 60
SESSION_MAX_S = 12 * 3600
SESSIONS_MAX = 1000
USERNAME_MAX = 256
PASSWORD_MAX = 1024
LOGIN_FAILURES_WINDOW_S = 60.0
LOGIN_FAILURES_MAX = 10
"""Failed logins per client address in the window before the console answers 429."""

ROLE_ADMIN = "admin"  # the bearer token: the console's own identity
ROLE_USER = "user"  # a SCRAM user: their identity, the brokers decide
ROLE_OPEN = "open"  # no login configured at all (loopback only)


@dataclass
class Session:
    id: str
    user: str
    role: str
    csrf: str
    created_s: float
    seen_s: float
    password: Secret | None = None
    clusters: tuple[str, ...] = ()
    """Clusters that accepted the user's SCRAM login (empty for the token and open roles)."""

    def expired(self, now_s: float) -> bool:
        return now_s - self.seen_s > SESSION_IDLE_S or now_s - self.created_s > SESSION_MAX_S

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


@dataclass
class Sessions:
    by_id: dict[str, Session] = field(default_factory=dict)
    failures: dict[str, list[float]] = field(default_factory=dict)

    def create(self, user: str, role: str, *, password: Secret | None = None,
               clusters: tuple[str, ...] = (), now_s: float | None = None) -> Session:
        now = time.time() if now_s is None else now_s
        self.expire(now)
        if len(self.by_id) >= SESSIONS_MAX:  # the oldest goes: bounded memory
            oldest = min(self.by_id.values(), key=lambda s: s.seen_s)
            del self.by_id[oldest.id]
        session = Session(secrets.token_urlsafe(32), user, role, secrets.token_urlsafe(32), now, now, password, clusters)
        self.by_id[session.id] = session
        return session

    def get(self, session_id: str | None, now_s: float | None = None) -> Session | None:
        if not session_id:
            return None
        now = time.time() if now_s is None else now_s
        session = self.by_id.get(session_id)
        if session is None or session.expired(now):
            self.by_id.pop(session_id or "", None)
            return None
        session.seen_s = now
        return session

    def drop(self, session_id: str | None) -> None:
        self.by_id.pop(session_id or "", None)

    def expire(self, now_s: float) -> None:
        for sid in [sid for sid, s in self.by_id.items() if s.expired(now_s)]:
            del self.by_id[sid]

    def too_many_failures(self, client: str, now_s: float | None = None) -> bool:
        now = time.time() if now_s is None else now_s
        recent = [t for t in self.failures.get(client, []) if now - t < LOGIN_FAILURES_WINDOW_S]
        self.failures[client] = recent
        return len(recent) >= LOGIN_FAILURES_MAX

    def failed(self, client: str, now_s: float | None = None) -> None:
        if len(self.failures) > SESSIONS_MAX:
            self.failures.clear()
        self.failures.setdefault(client, []).append(time.time() if now_s is None else now_s)


def token_matches(given: str, expected: Secret | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.reveal().encode())
