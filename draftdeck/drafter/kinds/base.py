"""What the stages ask of a drafter kind (`DrafterKind`), and the options every kind's parameters are
built from (`KindOptions`). The registry (draftdeck.drafter.kinds) gives both to the stages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel


@dataclass(frozen=True)
class Verifier:
    """The target an export names as its verifier (speculators' `speculators_config.verifier`): what
    `vllm serve <dir>` serves and speculators' model classes load beside the drafter. `architectures`:
    the target's config.json's."""

    name_or_path: str
    architectures: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name_or_path": self.name_or_path, "architectures": list(self.architectures)}


class DrafterKind:
    """What the stages ask of a drafter kind. The model and tensors are torch's; this module imports
    no torch, so that the CLI and the web app can name kinds without it."""

    name: str = ""
    title: str = ""  # as pages and logs name it: "DFlash", "EAGLE-3"
    summary: str = ""  # what it is, in a line (the train form's choice)
    options: tuple[type[KindOptions], ...] = ()  # the option groups its runs read
    chain: bool = False  # drafts one token after another (a chain), not a block in parallel
    # the demo's train options (`draftdeck demo --drafter NAME`): 7 drafts a step for every kind
    demo: Mapping[str, Any] = {}
    # the demo world's target architecture it needs (draftdeck.drafter.tiny), None: any
    demo_target: str | None = None
    # the eval's floor line (`untrained`: what `untrained` decodes with), as the eval page names it
    floor: str = "untrained"
    # why `--sharding fsdp` cannot train it (None: it can); auto then never picks fsdp, the plan leaves it out
    fsdp_refused: str | None = None

    # -- train -----------------------------------------------------------------------------------
    def trainer(self, params: Any, target: Any, data: Any) -> Any:
        """The trainer's part of a run (draftdeck.drafter.train.drafters.TrainKind)."""
        raise NotImplementedError

    def slots(self, params: Mapping[str, Any]) -> int:
        """A run's `Counts` slots from its job parameters: 1 + the drafts a step proposes at most."""
        raise NotImplementedError

    def drafting(self, block: int) -> str:
        """What a verify step of `block` (1 + its drafts) drafts, in words, the kind named:
        "DFlash, blocks of 8 (7 drafts)", "EAGLE-3, chains of 7 drafts"."""
        raise NotImplementedError

    def plan(self, shape: Any, target_config: Any) -> Any:
        """The drafter `draftdeck plan` counts (draftdeck.drafter.train.plan.PlannedDrafter)."""
        raise NotImplementedError

    def planned(self, plan: Any) -> tuple[str, str]:
        """A plan's drafter and what a row trains, in words: ("DFlash drafter (2 layers)", "512 anchors")."""
        raise NotImplementedError

    # -- a drafter folder: eval and export ---------------------------------------------------------
    def owns(self, config: Mapping[str, Any]) -> bool:
        """Whether a drafter folder's config.json is this kind's."""
        raise NotImplementedError

    def load(self, folder: Path, device: Any = "cpu") -> Any:
        """The drafter of a folder this kind owns, in eval mode on `device`."""
        raise NotImplementedError

    def verify_block(self, folder: Path, config: Mapping[str, Any]) -> int:
        """The verify block a checkpoint (`config`: its config.json) was trained for: 1 + the drafts a
        step proposes."""
        raise NotImplementedError

    confidence: bool = False  # its drafters may stop a block early on their own confidence

    def confident(self, drafter: Any) -> bool:
        """Whether this drafter has the head `source(threshold=...)` stops a block by."""
        return self.confidence

    def source(self, drafter: Any, target: Any, block: int, threshold: float = 0.0) -> Any:
        """The drafter as a draft source of real decoding (draftdeck.drafter.eval.spec_decode); with a
        `threshold`, a kind with `confidence` stops a block where its cumulative confidence falls below."""
        raise NotImplementedError

    def untrained(self, drafter: Any, seed: int) -> Any:
        """A freshly initialised drafter of the same shape: the floor a trained one rises from."""
        raise NotImplementedError

    def walked(self, drafter: Any, target: Any, batches: list[Any], block: int) -> Any:
        """The walked counts over `batches` (prompt + the target's output, the output trained)."""
        raise NotImplementedError

    def pair_problems(self, drafter: Any, target: Any) -> list[str]:
        """What makes `drafter` not trained for `target` (its width, vocabulary, tapped layers)."""
        raise NotImplementedError

    formats: tuple[str, ...] = ()  # the export formats, `auto`'s first
    format_names: Mapping[str, str] = {}  # each format as the CLI and the job log name it
    # the formats whose config.json names the verifier: an export in one needs the target (a folder
    # naming none is what `vllm serve <dir>` and speculators cannot load)
    verifier_formats: tuple[str, ...] = ()

    def export(self, drafter: Any, out: Path, fmt: str, verifier: Verifier | None) -> Path:
        """Write `drafter` to `out` in `fmt` (one of `formats`), atomically; `verifier`: the target a
        format of `verifier_formats` names."""
        raise NotImplementedError

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        """How each server's loader reads an export of a drafter trained for `block` (its `problems`:
        where it reads it otherwise than trained), and the `flags` that launch it."""
        raise NotImplementedError

    def tree_flags(self, server: str, tree: Mapping[str, int]) -> str | None:
        """Options that, added to `server`'s launch line (a `served` reading's), make it verify the draft
        tree the eval verified (`tree`: budget, topk, depth); None where no option of that server is
        known to (the line then serves chains)."""
        return None

    def export_summary(self, config: Mapping[str, Any]) -> str:
        """An export's config in a line: "block 8, target layers [1, 3], mask id 5"."""
        raise NotImplementedError

    def reading_line(self, reading: Mapping[str, Any]) -> str:
        """One server's reading (`served`) in a line."""
        raise NotImplementedError


def size_problems(hidden: int, vocab: int, target: Any) -> list[str]:
    """A drafter's width and vocabulary against its target's (`DrafterKind.pair_problems`)."""
    problems = []
    if hidden != int(target.config.hidden_size):
        problems.append(f"hidden size {hidden} vs the target's {target.config.hidden_size}")
    if vocab != int(target.config.vocab_size):
        problems.append(f"vocabulary {vocab} vs the target's {target.config.vocab_size}")
    return problems


class KindOptions(BaseModel):
    """A group of train options a drafter kind reads (each kind's options.py), composed into the train
    job's parameters (draftdeck.drafter.train.params.TrainParams): defined once, the form, the CLI and
    the API follow. A kind names the groups it reads (`DrafterKind.options`); a run of another kind
    refuses them when given."""

    title: ClassVar[str] = ""  # as a refusal names them: "an EAGLE-3 option"
    input_paths: ClassVar[tuple[str, ...]] = ()  # the fields that name a file to read

    @classmethod
    def groups(cls) -> list[type[KindOptions]]:
        """The option groups this class is made of (itself when it is one)."""
        return [b for b in cls.__mro__ if isinstance(b, type) and issubclass(b, KindOptions)
                and KindOptions in b.__bases__]  # fmt: skip

    @classmethod
    def kind_paths(cls) -> tuple[str, ...]:
        return tuple(p for g in cls.groups() for p in g.input_paths)
