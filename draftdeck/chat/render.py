"""Loading a model's tokenizer and chat template, offline, and rendering conversations with it.

Rendering uses the same compiled Jinja environment as HF ``apply_chat_template`` (sandboxed,
``raise_exception``, ``tojson``, ``{% generation %}`` tags) with the same variables (the tokenizer's
special tokens, ``tools``, ``add_generation_prompt`` and the template kwargs such as
``enable_thinking``), so the text is exactly what ``apply_chat_template(..., tokenize=False)`` gives,
without its per-call overhead.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftdeck.errors import InputError, UsageError
from draftdeck.formats.model import Conversation, Message, ToolCall

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


# Concurrent first imports of transformers' lazy modules race ("cannot import name 'AutoTokenizer' from
# 'transformers'"), and from_pretrained imports tokenizer classes lazily too: every load in a process
# (tokenize's, the dataset browser's) runs under this one lock.
transformers_lock = threading.Lock()


class TemplateError(Exception):
    """The chat template raised on a conversation (the row is rejected with `template_error`)."""


def load_tokenizer(path: Path | str, chat_template: Path | str | None = None) -> Any:
    """Load a HF fast tokenizer from a local folder, never from the network.

    `chat_template` is a file whose text replaces the tokenizer's own template.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"tokenizer folder {path} does not exist (pass a local folder with tokenizer.json)")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        # else transformers guesses at a slow tokenizer and advises installing tiktoken or sentencepiece
        raise InputError(f"{path}: not a tokenizer folder: no tokenizer.json or tokenizer_config.json")
    try:
        with transformers_lock:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise InputError(f"cannot load a tokenizer from {path}: {type(exc).__name__}: {exc}") from exc
    if not getattr(tok, "is_fast", False):
        raise UsageError(f"{path}: DraftDeck needs a fast (Rust) tokenizer with tokenizer.json")
    if chat_template is not None:
        try:
            tok.chat_template = Path(chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read chat template {chat_template}: {exc}") from exc
    if not isinstance(tok.chat_template, str) or not tok.chat_template.strip():
        raise UsageError(f"{path}: the tokenizer has no chat template; pass --chat-template FILE")
    return tok


def tokenizer_fingerprint(
    path: Path | str, template: str, template_kwargs: dict[str, Any] | None = None
) -> str:
    """sha256 over the tokenizer's files, the chat template text and the template kwargs."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        f = Path(path) / name
        if f.is_file():
            h.update(name.encode() + b"\0")
            h.update(f.read_bytes())
    h.update(b"template\0" + template.encode())
    h.update(b"kwargs\0" + json.dumps(template_kwargs or {}, sort_keys=True).encode())
    return h.hexdigest()


def _tool_call_dict(tc: ToolCall) -> dict[str, Any]:
    args = tc.arguments if tc.arguments_valid else tc.raw_arguments
    out: dict[str, Any] = {"type": "function", "function": {"name": tc.name, "arguments": args}}
    if tc.id is not None:
        out["id"] = tc.id
    return out


def message_dict(m: Message) -> dict[str, Any]:
    """A canonical message as chat templates expect it (OpenAI shape; reasoning under its usual names)."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning is not None:
        d["reasoning_content"] = m.reasoning
        d["thinking"] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = [_tool_call_dict(tc) for tc in m.tool_calls]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    return d


def conversation_dicts(conv: Conversation) -> list[dict[str, Any]]:
    return [message_dict(m) for m in conv.messages]


def control_tokens(tok: Any, template: str) -> tuple[str, ...]:
    """The added tokens that must stay text when typed inside a message: HF's own choice for
    ``sanitize_control_tokens`` (special tokens, plus added tokens the template writes), or every
    special added token with transformers versions that lack it."""
    get = getattr(tok, "_get_control_tokens", None)
    if callable(get):
        return tuple(get(template))
    return tuple(t.content for t in tok.added_tokens_decoder.values() if t.special)


_DICT_ATTRIBUTES = frozenset(dir(dict))
# str methods that neither format (str.format is the sandbox's known escape) nor mutate anything
_STR_METHODS = frozenset(
    [
        "split",
        "rsplit",
        "splitlines",
        "strip",
        "lstrip",
        "rstrip",
        "startswith",
        "endswith",
        "replace",
        "lower",
        "upper",
        "title",
        "capitalize",
        "find",
        "rfind",
        "count",
        "join",
        "partition",
        "rpartition",
        "isspace",
        "isdigit",
        "isalpha",
        "removeprefix",
        "removesuffix",
    ]
)


_LOOP_ATTRIBUTES = frozenset(
    [
        "index0",
        "index",
        "first",
        "last",
        "length",
        "revindex",
        "revindex0",
        "depth",
        "depth0",
        "previtem",
        "nextitem",
    ]
)
_MISSING = object()


def compile_template(template: str) -> Any:
    """Compile `template` in HF's sandboxed chat-template environment (a fresh one, not HF's cached one),
    with a fast path for reading keys of plain dicts (``m.role``, ``m['content']``), loop variables
    (``loop.index0``), namespace values (``ns.last_query``), and for getting and calling plain
    string methods (``content.split('x')``).

    The sandbox checks every attribute access; for a key of a plain ``dict`` that is not a dict method
    name, Jinja's own lookup ends at ``obj[key]`` anyway, so returning it directly gives the same value
    without the checks (a missing key gives the same Undefined). The listed ``str`` methods and loop
    attributes are ones the sandbox allows too (it refuses only ``format``/``format_map`` and private
    names); namespace values are returned only when not callable. Everything else goes through the
    sandbox unchanged.
    """
    from jinja2.runtime import LoopContext
    from jinja2.utils import Namespace
    from transformers.utils import chat_template_utils as ctu

    # a fresh compile (its own environment, which we patch), never HF's lru-cached one
    fresh = getattr(ctu, "_cached_compile_jinja_template", None) or ctu._compile_jinja_template.__wrapped__
    compiled = fresh(template)
    env = compiled.environment
    sandbox_getattr, sandbox_getitem = env.getattr, env.getitem

    undefined = env.undefined

    def getattr_(obj: Any, attribute: Any) -> Any:
        kind = type(obj)
        if kind is dict and type(attribute) is str and attribute not in _DICT_ATTRIBUTES:
            # the sandbox would try getattr (no such attribute), then obj[key], then Undefined
            return obj[attribute] if attribute in obj else undefined(obj=obj, name=attribute)
        if kind is str and attribute in _STR_METHODS:
            return getattr(obj, attribute)
        if kind is LoopContext and attribute in _LOOP_ATTRIBUTES:
            return getattr(obj, attribute)
        if isinstance(obj, Namespace) and type(attribute) is str and not attribute.startswith("_"):
            value = getattr(obj, attribute, _MISSING)
            if value is not _MISSING and not callable(value):
                return value
        return sandbox_getattr(obj, attribute)

    def getitem(obj: Any, argument: Any) -> Any:
        if type(obj) is dict and type(argument) is str and argument in obj:
            return obj[argument]
        return sandbox_getitem(obj, argument)

    sandbox_call = env.call

    def call(context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        if type(getattr(obj, "__self__", None)) is str and getattr(obj, "__name__", "") in _STR_METHODS:
            kwargs.pop("_loop_vars", None)  # Jinja's own bookkeeping, dropped by Context.call too
            kwargs.pop("_block_vars", None)
            return obj(*args, **kwargs)
        return sandbox_call(context, obj, *args, **kwargs)

    env.getattr = getattr_
    env.getitem = getitem
    env.call = call
    return compiled


@dataclass
class ChatRenderer:
    """Renders message lists with one template; picklable (the template is compiled lazily)."""

    template: str
    special_tokens: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    control_tokens: tuple[str, ...] = ()
    _compiled: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_tokenizer(cls, tok: Any, kwargs: dict[str, Any] | None = None) -> ChatRenderer:
        template = tok.chat_template
        specials = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str | list)}
        return cls(template, specials, dict(kwargs or {}), control_tokens(tok, template))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_compiled"] = None
        return state

    @property
    def compiled(self) -> Any:
        if self._compiled is None:
            self._compiled = compile_template(self.template)
        return self._compiled

    @property
    def has_generation_tags(self) -> bool:
        import re

        return re.search(r"\{%-?\s*generation\s*-?%\}", self.template) is not None

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        """Render; raise :class:`TemplateError` with the template's message when it raises."""
        try:
            return str(
                self.compiled.render(
                    messages=messages,
                    tools=tools or None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **{**self.special_tokens, **self.kwargs},
                )
            )
        except Exception as exc:  # jinja2 TemplateError, and whatever a template's own code raises
            msg = str(exc) or type(exc).__name__
            raise TemplateError(msg) from exc
