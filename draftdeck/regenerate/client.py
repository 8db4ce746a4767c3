"""The OpenAI-compatible backend: several endpoints round-robin, bounded retries with backoff and
jitter on 429, 5xx and connection errors, and a preflight that stops a job before its first row when
the key is refused or the model is not served."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import httpx

from draftdeck.errors import JobFailed, UsageError
from draftdeck.provenance import ModelIdentity
from draftdeck.regenerate.answer import Answer, RowRejected, parse_completion
from draftdeck.regenerate.images import has_image_parts
from draftdeck.regenerate.params import RegenerateParams

# Words servers use when a prompt does not fit (vLLM, SGLang, TGI, OpenAI).
_TOO_LONG = ("maximum context length", "context length", "too long", "context window", "max_model_len")
# Words of a server refusing image input (vLLM: "... is not a multimodal model"; others name the part)
_NO_IMAGES = ("image", "multimodal", "multi-modal", "vision", "modality")


MAX_BACKOFF_S = 30.0


class EndpointsDown(JobFailed):
    """Every endpoint kept failing with connection errors: the job stops (the journal keeps what was
    done, so a rerun resumes)."""


def api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class Endpoint:
    url: str
    requests: int = 0
    ok: int = 0
    errors: int = 0
    last_error: str | None = None
    token_ids: bool = True  # False: the server refused `return_token_ids`; it is no longer sent

    def health(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.errors,
            "last_error": self.last_error,
            "return_token_ids": self.token_ids,
        }


def refuses_token_ids(status: int, text: str) -> bool:
    """Whether an error answer is a server refusing the `return_token_ids` field (`transformers serve`:
    422 "Unexpected fields in the request"; strict OpenAI-compatible servers: 400 naming it)."""
    return status in (400, 422) and "return_token_ids" in text


class OpenAIBackend:
    def __init__(self, params: RegenerateParams):
        self.params = params
        self.endpoints = [Endpoint(api_base(u)) for u in params.endpoints]
        # a server is known by the model name it serves (recorded in every row it answers)
        self.identity = ModelIdentity(str(params.model), served=True)
        self.vocab = None  # a server's vocabulary is not known here: tokenize checks its ids by decoding
        self._next = 0
        key = params.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limits = httpx.Limits(
            max_connections=params.concurrency, max_keepalive_connections=params.concurrency
        )
        self._client = httpx.AsyncClient(headers=headers, limits=limits, timeout=params.timeout_s)
        self._body = {
            "model": params.model,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "chat_template_kwargs": params.template_kwargs(),
            **({"seed": params.seed} if params.seed is not None else {}),
            # vLLM answers with the generated ids (kept, so tokenize need not re-encode the text);
            # a server that refuses the field is asked again without it (Endpoint.token_ids)
            "return_token_ids": True,
        }

    async def aclose(self) -> None:
        await self._client.aclose()

    def _pick(self) -> Endpoint:
        ep = self.endpoints[self._next % len(self.endpoints)]
        self._next += 1
        return ep

    async def _sleep(self, attempt: int) -> None:
        base = min(self.params.backoff_s * (2**attempt), MAX_BACKOFF_S)
        await asyncio.sleep(base * (0.5 + random.random()))  # jitter: retries of many rows spread out

    async def preflight(self) -> None:
        """Each endpoint lists models at /v1/models, accepts the key, and serves `model`."""
        for ep in self.endpoints:
            resp = None
            for attempt in range(self.params.retries + 1):
                try:
                    resp = await self._client.get(ep.url + "/models")
                except httpx.TransportError as exc:
                    ep.last_error = f"{type(exc).__name__}: {exc}"
                else:
                    if resp.status_code < 500 and resp.status_code != 429:
                        break
                    ep.last_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if attempt < self.params.retries:
                    await self._sleep(attempt)
            else:
                raise EndpointsDown(
                    f"{ep.url} did not answer /models after {self.params.retries + 1} tries: {ep.last_error}"
                )
            assert resp is not None
            if resp.status_code in (401, 403):
                raise UsageError(f"{ep.url} refused the API key (HTTP {resp.status_code}): {resp.text[:200]}")
            try:
                ids = [m["id"] for m in resp.json()["data"]]
            except (ValueError, KeyError, TypeError):
                raise UsageError(
                    f"{ep.url}/models is not an OpenAI-compatible model list (HTTP {resp.status_code}):"
                    f" {resp.text[:200]}"
                ) from None
            if self.params.model not in ids:
                raise UsageError(
                    f"model {self.params.model!r} is not served at {ep.url}; it serves: {', '.join(ids[:10])}"
                )

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Answer:
        body = {**self._body, "messages": messages, **({"tools": tools} if tools else {})}
        bare = {k: v for k, v in body.items() if k != "return_token_ids"}
        url = "/chat/completions"
        retries = self.params.retries
        last, transport = "", False
        for attempt in range(retries + 1):
            ep = self._pick()
            ep.requests += 1
            try:
                asked = ep.token_ids  # (requests in flight meanwhile may learn the refusal too)
                resp = await self._client.post(ep.url + url, json=body if asked else bare)
                if asked and refuses_token_ids(resp.status_code, resp.text):
                    ep.token_ids = False  # not asked again at this endpoint; this answer is asked at once
                    resp = await self._client.post(ep.url + url, json=bare)
            except httpx.TimeoutException:
                last, transport = f"{ep.url}: timed out after {self.params.timeout_s:g}s", False
            except httpx.TransportError as exc:
                last, transport = f"{ep.url}: {type(exc).__name__}: {exc}", True
            else:
                status = resp.status_code
                if status == 200:
                    try:
                        data = resp.json()
                    except ValueError:
                        ep.errors += 1
                        raise RowRejected("malformed_answer", f"{ep.url}: the answer is not JSON") from None
                    ep.ok += 1
                    return parse_completion(data, ep.url)
                text = resp.text[:300]
                if status in (401, 403):
                    raise UsageError(f"{ep.url} refused the API key (HTTP {status}): {text}")
                if status == 404:
                    raise UsageError(f"{ep.url} has no model {self.params.model!r} (HTTP 404): {text}")
                if status in (400, 413, 422) and any(w in text.lower() for w in _TOO_LONG):
                    ep.errors += 1
                    raise RowRejected("prompt_too_long", f"{ep.url} (HTTP {status}): {text}")
                refused = status in (400, 422) and any(w in text.lower() for w in _NO_IMAGES)
                if refused and has_image_parts(messages):  # a text-only server
                    ep.errors += 1
                    raise RowRejected(
                        "multimodal_content", f"{ep.url} refused the row's images (HTTP {status}): {text}"
                    )
                if status != 429 and status < 500:
                    ep.errors += 1
                    raise RowRejected("server_error", f"{ep.url} (HTTP {status}): {text}")
                last, transport = f"{ep.url}: HTTP {status}: {text}", False
            ep.errors += 1
            ep.last_error = last
            if attempt < retries:
                await self._sleep(attempt)
        if transport:
            raise EndpointsDown(f"no endpoint answered after {retries + 1} tries; last error: {last}")
        raise RowRejected("server_error", f"after {retries + 1} tries: {last}")

    def health(self) -> list[dict[str, Any]]:
        return [ep.health() for ep in self.endpoints]
