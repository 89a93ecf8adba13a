"""Logging in to the console as a browser does: the login page first (its form carries a
token matching a cookie it sets: login CSRF), then the form posted with it."""

from __future__ import annotations

import re
from typing import Any

LOGIN_CSRF = re.compile(r'name="login_csrf" value="([^"]+)"')


def login_token(html: str) -> str:
    found = LOGIN_CSRF.search(html)
    assert found, "no login form token in the page"
    return found.group(1)


async def post_login(client: Any, fields: dict[str, str], prefix: str = "") -> Any:
    """An httpx.AsyncClient: GET /login, then POST it with `fields` (cookies kept by the client)."""
    page = await client.get(prefix + "/login")
    return await client.post(prefix + "/login", data={**fields, "login_csrf": login_token(page.text)})


def post_login_sync(client: Any, fields: dict[str, str], prefix: str = "", **kwargs: Any) -> Any:
    """The same with an httpx.Client or a requests.Session."""
    page = client.get(prefix + "/login", **kwargs)
    return client.post(prefix + "/login", data={**fields, "login_csrf": login_token(page.text)}, **kwargs)
