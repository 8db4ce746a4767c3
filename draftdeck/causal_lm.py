"""Loading a local model folder as a causal language model, for every job that runs a target
(regenerate --local, train, eval): the config is checked before any weight is read, a checkpoint
published with a vision tower gives its language model only, and a checkpoint that leaves weights of
the model at their random initial values is refused, never run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftdeck.errors import UsageError


class ModelFolderError(UsageError):
    """A model folder that cannot serve as a target (missing, not a causal LM, unreadable)."""


# Where checkpoints published with a vision tower keep their language model's weights (Gemma 3 keeps
# its original `language_model.model.`, transformers 5 saves `model.language_model.`): read as a
# text-only causal LM's. The vision tower's keys match none and are not loaded.
LANGUAGE_MODEL_KEYS = {
    r"^model\.language_model\.": "model.",
    r"^language_model\.model\.": "model.",
    r"^language_model\.lm_head\.": "lm_head.",
}


def read_model_config(folder: Path) -> dict[str, Any]:
    """`folder`'s config.json as it is written."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelFolderError(f"{folder}: not a model folder (no config.json)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFolderError(f"{path}: cannot read the target config: {e}") from e
    if not isinstance(cfg, dict):
        raise ModelFolderError(f"{path}: the config is not a JSON object")
    return cfg


def max_positions(folder: str | Path) -> int | None:
    """The positions the model in `folder` reads at most (`max_position_embeddings`, of its text
    config where it has one), from config.json alone; None when the folder holds no model config
    (a tokenizer on its own)."""
    try:
        raw = read_model_config(Path(folder))
    except ModelFolderError:
        return None
    text = raw.get("text_config")
    value = (text if isinstance(text, dict) else raw).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def causal_lm_config(folder: str | Path) -> Any:
    """The transformers config a causal LM of `folder` is built from, read without any weight: the
    text config of a checkpoint whose causal-LM class would bring its vision tower along (Gemma 3 as
    published). Refuses, naming the architecture and the reason, what cannot be a target."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"{folder}: the target folder does not exist")
    raw = read_model_config(folder)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ModelFolderError(f"{folder}: transformers cannot read its config: {e}") from e
    kind = ", ".join(raw.get("architectures") or []) or str(config.model_type)
    if getattr(config, "is_encoder_decoder", False):
        raise ModelFolderError(
            f"{folder}: {kind} is an encoder-decoder model: a drafter conditions on a decoder-only "
            "target's hidden states and drafts its next tokens"
        )
    mapping = AutoModelForCausalLM._model_mapping
    text = config.get_text_config()
    whole = mapping.get(type(config), None)
    if (
        text is not config
        and type(text) in mapping
        and (whole is None or "ForConditionalGeneration" in getattr(whole, "__name__", ""))
    ):
        # the checkpoint's head is shared with its embedding as the whole model's config says
        text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", text.tie_word_embeddings))
        config = text
    elif whole is None:
        raise ModelFolderError(
            f"{folder}: not a causal language model: {kind} has no AutoModelForCausalLM class"
        )
    for needed in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if not getattr(config.get_text_config(), needed, None):
            raise ModelFolderError(f"{folder}: {kind}'s config names no {needed}: the drafter needs it")
    return config


@contextmanager
def _quiet_load_report() -> Iterator[None]:
    """transformers' load report and its "Loading weights" progress bar (which a terminal and a job's
    log would show as noise) are off for the load; its errors still show, and the caller's settings
    come back after."""
    from transformers.utils import logging

    before, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(before)
        if bars:
            logging.enable_progress_bar()


def load_causal_lm(folder: str | Path, *, dtype: Any = None) -> tuple[Any, str]:
    """(the causal LM of `folder` in eval mode, what of the folder is in memory, for the job's log)."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    config = causal_lm_config(folder)
    try:
        with _quiet_load_report():  # it lists every vision-tower key as not loaded
            with_info: Any = AutoModelForCausalLM.from_pretrained(
                folder, config=config, local_files_only=True, dtype=dtype, key_mapping=LANGUAGE_MODEL_KEYS,
                output_loading_info=True,
            )  # fmt: skip
            model, info = with_info
    except ValueError as e:
        raise ModelFolderError(f"{folder}: not a causal language model ({type(config).__name__}): {e}") from e
    except OSError as e:
        raise ModelFolderError(f"{folder}: cannot load the model weights: {e}") from e
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # left at their random initial values: a target that is not the checkpoint
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        name = type(model).__name__
        raise ModelFolderError(
            f"{folder}: {len(missing)} of {name}'s weights are not in the checkpoint ({shown}): not a "
            f"{name} checkpoint, or one this version of transformers names differently"
        )
    return model.eval(), _loaded(read_model_config(folder), model)


def _loaded(raw: dict[str, Any], model: Any) -> str:
    """`model`'s class, and where the checkpoint is more than a language model (a vision tower beside
    it), that only its language model was loaded: said from what is in memory, not from the config."""
    name = type(model).__name__
    if "vision_config" not in raw and "text_config" not in raw:
        return name
    published = ", ".join(raw.get("architectures") or []) or str(raw.get("model_type"))
    if any("visual" in n or "vision" in n for n, _ in model.named_parameters()):
        return f"{name}, a {published} checkpoint with its vision tower loaded"
    return (
        f"{name}, the language model of a {published} checkpoint (its text_config; the vision "
        f"tower's weights are not loaded)"
    )
