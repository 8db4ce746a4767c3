"""The issue codes' registry: each code's name, default action (reject, warn, fail) and description.

Every bad input a pipeline meets is one of these codes, counted in a report whose policy
(draftdeck.quality) decides what the action does to the row and the job; docs/ lists them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    """What an issue does to its row and to the job."""

    REJECT = "reject"  # the row is dropped and counted under `rejected`
    WARN = "warn"  # the row is kept and the issue counted under `warnings`
    FAIL = "fail"  # the job fails as soon as the issue is seen


@dataclass(frozen=True)
class IssueCode:
    name: str
    action: Action
    description: str
    # False for the rows a recipe chose not to take (a mix's filters and draw): not data lost, so not
    # counted by max_rejected or the rejected-share alert
    loss: bool = True


def _codes(*items: tuple[str, Action, str]) -> dict[str, IssueCode]:
    return {
        name: IssueCode(name, action, text, name not in CHOSEN and name not in FOLDED)
        for name, action, text in items
    }


CHOSEN = frozenset({"filtered_out", "not_sampled"})
# Input rows that are part of another row's conversation, or say nothing a conversation holds: an agent
# session's later lines and events, its summary and bookkeeping lines. Counted, not lost.
FOLDED = frozenset({"merged_event", "session_metadata"})


# Codes a kept row may carry that are no issue: how it was made (the sample view shows them apart).
NOTES = {"ids_from_target": ("answer tokens", "the target's own ids, as it generated them (not re-encoded)")}

CODES: dict[str, IssueCode] = _codes(
    ("json_error", Action.REJECT, "the row is not valid JSON"),
    ("encoding_error", Action.REJECT, "the row is not valid UTF-8"),
    ("oversize_row", Action.REJECT, "the row is larger than the configured limit"),
    ("too_deep", Action.REJECT, "the row nests arrays and objects more than 1,024 levels deep"),
    ("not_an_object", Action.REJECT, "the row is valid JSON but not an object"),
    ("unknown_format", Action.REJECT, "no known chat shape matches the row's keys"),
    ("format_mismatch", Action.REJECT, "the row is not of the shape --from forces"),
    (
        "multimodal_content",
        Action.REJECT,
        "the row holds audio or video (or images, read with --images reject): no drafter learns them",
    ),
    # images in the data (draftdeck.formats.images): each image of a row is loaded and checked
    ("image_missing", Action.REJECT, "an image the row names is not there (no such file)"),
    ("image_unreadable", Action.REJECT, "an image's bytes are not an image PIL can decode"),
    ("image_too_large", Action.REJECT, "an image is over the byte or pixel limit (--max-image-*)"),
    ("image_url_unread", Action.REJECT, "an image given as an http(s) URL: never fetched"),
    ("image_outside_roots", Action.REJECT, "an image file outside the data roots (a job run by the service)"),
    (
        "image_placeholder_mismatch",
        Action.REJECT,
        "the <image> placeholders in the text are not as many as the row's images",
    ),
    ("empty_conversation", Action.REJECT, "the conversation has no messages"),
    (
        "merged_event",
        Action.REJECT,
        "a line or event of an agent session, merged into the session's conversation (its first counts)",
    ),
    (
        "session_metadata",
        Action.REJECT,
        "an agent session's summary or bookkeeping line or event, not a turn",
    ),
    (
        "abandoned_branch",
        Action.REJECT,
        "a line of an agent session on a branch it left (a turn edited or retried): not on the kept path",
    ),
    (
        "contained_prefix",
        Action.WARN,
        "the row's episode list holds prefixes of a longer episode: left out, trained once in the longer",
    ),
    ("empty_turn", Action.WARN, "a message has neither text, reasoning nor tool calls"),
    ("empty_assistant_turn", Action.REJECT, "an empty assistant turn (trains only end-of-turn tokens)"),
    ("no_user_turn", Action.REJECT, "the conversation has no user message"),
    ("no_assistant_turn", Action.REJECT, "the conversation has no assistant message (prompt-only)"),
    ("trailing_user_turn", Action.WARN, "the conversation ends on a user message"),
    ("non_alternating", Action.WARN, "user and assistant turns do not alternate"),
    ("unknown_role", Action.REJECT, "a message has a role no chat template knows"),
    ("invalid_tool_arguments", Action.WARN, "a tool call's arguments are not valid JSON (kept as text)"),
    ("orphan_tool_result", Action.WARN, "a tool result answers no earlier tool call"),
    ("placeholder_response", Action.REJECT, "the same short answer ('OK.') to many different prompts"),
    ("placeholder_stripped", Action.WARN, "placeholder answers removed: the row is a prompt to regenerate"),
    ("duplicate_conversation", Action.WARN, "the conversation appeared earlier in the input"),
    ("unrepresentable_field", Action.WARN, "the target format cannot hold a field; it was left out"),
    ("unused_text_field", Action.WARN, "a field of long text no reader used (kept, not trained on)"),
    # nothing of the conversation is lost: what a reader cannot keep rejects the row (a policy may downgrade)
    ("lost_part", Action.REJECT, "a content part of a type no reader keeps (it would be lost)"),
    ("lost_system", Action.REJECT, "a system prompt that cannot be kept as text"),
    ("lost_tools", Action.REJECT, "tool definitions that cannot be read (the template renders them)"),
    ("tools_kept_as_text", Action.WARN, "function definitions in a system text do not parse: kept as text"),
    ("tool_tags_unparsed", Action.WARN, "a <tool_call> or <tool_response> block is not JSON: kept as text"),
    ("redacted_reasoning", Action.WARN, "the answer's reasoning is redacted: kept, but no template shows it"),
    ("system_conflict", Action.WARN, "a top-level system prompt and a system message: both kept, in order"),
    ("preference_chosen", Action.WARN, "a preference row: its chosen answer kept, the rejected one left out"),
    ("preference_row", Action.REJECT, "a preference row, refused by --preference reject"),
    # per-turn training flags
    ("untrained_answer", Action.WARN, "answers a per-turn flag leaves untrained: context, not loss"),
    ("invalid_train_flag", Action.REJECT, "a per-turn training flag with a value no format allows"),
    ("partial_loss_weight", Action.WARN, "a fractional loss_weight: the turn is trained (masks are 0 or 1)"),
    ("trained_non_assistant", Action.REJECT, "a flag asks to train a user, system or tool turn"),
    ("template_error", Action.REJECT, "the chat template raised on the conversation"),
    # what the template left out of the rendered row (draftdeck.chat.coverage): trained on, it is lost
    ("template_dropped_content", Action.REJECT, "the chat template left an answer's text out"),
    ("template_dropped_tool_calls", Action.REJECT, "the chat template left an answer's tool calls out"),
    ("template_dropped_reasoning", Action.REJECT, "the chat template left an answer's reasoning out"),
    ("template_dropped_tools", Action.REJECT, "the chat template left the tool definitions out"),
    ("template_dropped_system", Action.REJECT, "the chat template left the system prompt out"),
    ("no_trained_tokens", Action.REJECT, "the row has no token with loss"),
    ("truncated", Action.WARN, "the row was cut at the sequence length"),
    ("too_long", Action.REJECT, "the row is longer than the sequence length and truncation is 'drop'"),
    ("longer_than_target", Action.REJECT, "the row is longer than the target reads (its positions)"),
    ("no_dflash_anchor", Action.WARN, "the row has no two consecutive trained tokens"),
    ("mask_mismatch", Action.FAIL, "decoding the trained tokens did not give the assistant text"),
    ("encoder_mismatch", Action.WARN, "the fast encoder disagreed with the model's tokenizer"),
    ("ids_reencoded", Action.WARN, "the target's recorded token ids did not fit: answers encoded from text"),
    # regeneration (draftdeck.regenerate): checks on the target's answers
    ("answer_cut_off", Action.REJECT, "the target stopped at max_tokens (finish_reason 'length')"),
    ("empty_answer", Action.REJECT, "the target's answer has no content and no tool calls"),
    ("reasoning_in_content", Action.REJECT, "reasoning markers (<think>) in the content with reasoning off"),
    ("invalid_tool_call", Action.REJECT, "a tool call of the target's answer is not valid JSON"),
    ("tool_calls_diverged", Action.WARN, "the target's tool calls differ from the source's: cut there"),
    ("prompt_too_long", Action.REJECT, "the prompt is longer than the target's context window"),
    ("malformed_answer", Action.REJECT, "the server's answer is not a valid chat completion"),
    ("server_error", Action.REJECT, "the server kept failing on this row after every retry"),
    # export-drafter (each drafter kind's export): the config read as each server's loader reads it
    (
        "served_config",
        Action.WARN,
        "a server would refuse the export, or fill the draft block with another mask id than trained",
    ),
    # cache-hidden (draftdeck.hidden.checks): a stored row that is not the target's hidden states
    ("hidden_ids_mismatch", Action.FAIL, "a cached row's token ids are not the dataset's row"),
    ("hidden_shape_mismatch", Action.FAIL, "a cached row's shape is not [tokens, layers, hidden]"),
    ("hidden_nonfinite", Action.FAIL, "a cached row holds NaN or inf"),
    ("hidden_zero_layer", Action.FAIL, "a cached layer is all zero over a row (vLLM's hybrid bug)"),
    ("hidden_constant_layer", Action.FAIL, "a cached layer holds one value over a row"),
    (
        "hidden_live_mismatch",
        Action.FAIL,
        "a cached row differs from a live forward beyond the dtype's tolerance",
    ),
    # mix (draftdeck.mix): what a recipe takes of each source
    ("filtered_out", Action.REJECT, "the row fails a filter of its source in the mix recipe"),
    (
        "duplicate_removed",
        Action.REJECT,
        "the conversation is already in the mix, from this or another source",
    ),
    ("not_sampled", Action.REJECT, "not drawn: the source's quota or weight takes fewer rows than it has"),
    ("upsampled", Action.WARN, "a source gives more rows than it has: some of its rows are repeated"),
)


def code(name: str) -> IssueCode:
    try:
        return CODES[name]
    except KeyError:
        raise KeyError(f"unknown issue code {name!r}; known codes: {', '.join(sorted(CODES))}") from None
