"""GET a server's `/metrics` text, with an optional bearer token; every failure is a ScrapeError that
names the URL and the reason (the scraper records it as the endpoint's health, the CLI exits 2)."""

from __future__ import annotations

from draftdeck.errors import InputError

TIMEOUT_SECONDS = 10.0


class ScrapeError(InputError):
    """The metrics URL could not be read."""


def fetch_text(url: str, *, token: str | None = None, timeout: float = TIMEOUT_SECONDS) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url, headers=headers, timeout=timeout, follow_redirects=True)
    except httpx.InvalidURL as e:
        raise ScrapeError(f"{url}: not a URL ({e})") from None
    except httpx.HTTPError as e:
        raise ScrapeError(f"{url}: cannot reach it ({type(e).__name__}: {e})") from None
    if response.status_code != 200:
        raise ScrapeError(f"{url}: HTTP {response.status_code} {response.reason_phrase}")
    return response.text
