"""The `convert` package: chat data in any known shape -> OpenAI messages JSONL, ShareGPT JSONL or Parquet.

Two entry points:

- :func:`read_conversations` streams the valid conversations of some input files and counts every
  row in a :class:`Report` (rows_in, rows_expanded, rejected by code, warnings, formats). Conversion
  and tokenization both consume it. **The consumer counts rows_out** for each conversation it keeps
  (or rejects it under its own code), so that ``rows_in + rows_expanded == rows_out + rejected``.
- :func:`convert` writes them with a :class:`draftdeck.formats.writers.Writer` and applies the policy.

Checks per conversation (the code's action comes from the :class:`Policy`: reject, warn or fail):
empty_conversation, empty_turn, no_user_turn, no_assistant_turn (unless prompt-only rows are
allowed), trailing_user_turn, non_alternating, orphan_tool_result, invalid_tool_arguments,
unrepresentable_field, placeholder_response and duplicate_conversation; an empty assistant turn
(no text, reasoning or tool calls: it would train only the template's end-of-turn tokens) is
empty_assistant_turn, rejected by default, other empty messages are empty_turn (a warning).

Placeholder answers (design). Seeds in the wild padded prompt-only data with a dummy ``"OK."``
answer on every row. A row is a placeholder *candidate* when all its assistant turns are short text
(``placeholder_max_chars`` after normalising: case-folded, whitespace collapsed, trailing punctuation
dropped) with no tool calls and no reasoning; its key is the tuple of those normalised answers
(:mod:`draftdeck.convert.placeholders`). What makes padding is the same answer to many *different* prompts,
so each key counts the distinct prompts (a hash of the non-assistant messages) it answers: the same
row repeated by duplicated data is one prompt, and the duplicate check's business. A key is a
placeholder when

- it is a known filler (``ok``, ``okay``, ``n/a``, ``todo``, ``tbd``, ``placeholder``, ``…``, empty)
  on ``placeholder_filler_rows`` (3) different prompts: a few are enough, whatever the input's size;
- or any other short answer on ``placeholder_min_rows`` (32) different prompts that are also
  ``placeholder_min_share`` (20 %) of the conversations checked so far: "Yes." to 40 different
  questions among 1,000 rows is a real answer, "I cannot help." on most rows is padding.

A flagged key's rows get ``placeholder_response``; ``placeholders`` says what then happens to them:
``reject`` (the policy's action, reject by default), ``strip`` (the answers are removed and the row
leaves as a prompt-only row, ready for regeneration, warned as ``placeholder_stripped``) or ``keep``
(kept, warned). To decide in one pass, candidate rows wait in a bounded FIFO buffer
(``placeholder_buffer`` rows) and are judged when they leave it: a filler key is flagged as soon as
it crosses its threshold; any other key is judged with the counts of the moment a row of it leaves
the buffer (overflow) or at the end of the input (then exact: the share is that of the whole input).
Buffered rows are yielded late, so the output order differs from the input order for them only.
Rows released before their key was flagged stay (counted in
``report.extra["placeholder"]["released_before_flag"]``); once flagged, a key stays flagged. A second
pass would be exact in every case but reads the input twice; the buffer is exact for inputs with
fewer candidates than it holds, and for the usual padding (one answer on most rows) at one read.
Memory: one prompt hash (~60 bytes in a set) per distinct prompt of each candidate key not flagged
yet; a flagged key drops its set.

Duplicates: a 64-bit hash of the normalised messages (role, stripped content, reasoning, tool calls)
per kept row, in a set: memory grows by ~60 bytes per distinct kept conversation, not with row size.

The modules: :mod:`.options` (what a run may be told), :mod:`.checks` (the per-conversation checks),
:mod:`.placeholders` and :mod:`.verdicts` (the policy, the placeholder buffer, the duplicate set),
:mod:`.reading` (read_conversations: tokenize, regenerate, scan and the Parquet target), :mod:`.workers`,
:mod:`.fast` (with :mod:`.fast_tools` and :mod:`.fast_line`) and :mod:`.parallel` (the record path
every JSONL target takes: in this process with one worker, in worker processes with more; its fast
path writes the usual rows, tool calls included, without the canonical model), :mod:`.run`
(``convert`` itself) and :mod:`.scan` (the pre-flight). Importers use this package's names; no module
imports another's private names.
"""

from draftdeck.convert.checks import check_conversation, duplicate_key
from draftdeck.convert.options import ConvertOptions
from draftdeck.convert.placeholders import placeholder_key
from draftdeck.convert.reading import input_files, read_conversations
from draftdeck.convert.run import check_out, convert

__all__ = [
    "ConvertOptions",
    "check_conversation",
    "check_out",
    "convert",
    "duplicate_key",
    "input_files",
    "placeholder_key",
    "read_conversations",
]
