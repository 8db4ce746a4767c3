"""What a browser does with the dashboard's forms, for tests that post them without one."""

from __future__ import annotations

import re
from typing import Any

# a form's hidden field, or the page's htmx headers (every page has them)
_TOKEN = re.compile(r'name="csrf" value="([^"]+)"|"x-csrf-token": "([^"]+)"')


def token_in(html: str) -> str:
    """The CSRF token a page put in its forms (signed by the server: a page never echoes a cookie)."""
    found = _TOKEN.search(html)
    assert found, "the page has no form token"
    return found.group(1) or found.group(2)


def form_token(client: Any) -> str:
    """The CSRF token the server gives `client` (a TestClient keeping its cookies) in its forms."""
    return token_in(client.get("/login").text)


def compare_cells(page: str, label: str) -> list[str]:
    """The cells of the compare view's row `label`, in run order, as text (tags dropped)."""
    table = page.split('id="compare-table"', 1)[1].split("</table>", 1)[0]
    row = table.split(f'<th scope="row">{label}', 1)[1].split("</tr>", 1)[0]
    return [" ".join(c.split("<", 1)[0].split()) for c in row.split('<td class="num">')[1:]]
