"""The drafter kinds, by name: one package each under draftdeck/drafter/kinds/<kind>/, as
draftdeck/kinds.py names the job kinds by module path.

A kind's package holds all that differs by kind: its model and config, its objective and held-out walk
(train.py, objective.py, walked.py), its draft source for real decoding (source.py), its export formats
and loader (export.py), its options (options.py). Its `__init__` gives `KIND`, a `DrafterKind`: what the
stages ask of it. The stages (draftdeck/drafter/train, eval, export, plan, the CLI and app/) know the
kinds only through this registry; none imports a kind's package (tests/project/test_layers.py checks).
The building blocks every kind shares stay in draftdeck/drafter/model/ (layers, attention, the target,
the vocabulary-parallel head, the chunked loss) and train/ (data, counts, the walk, the loss mix).

Adding a kind: docs/contributing.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from draftdeck.errors import UsageError

PACKAGES: dict[str, str] = {
    "dflash": "draftdeck.drafter.kinds.dflash",
    "eagle3": "draftdeck.drafter.kinds.eagle3",
}
NAMES: tuple[str, ...] = tuple(PACKAGES)
if TYPE_CHECKING:
    DrafterName = str
else:  # the parameter models' choices (train's `drafter`, plan's): every kind by name
    DrafterName = Literal[NAMES]


class DrafterKind:
    """What the stages ask of a drafter kind. The model and tensors are torch's; this module imports
    no torch, so that the CLI and the web app can name kinds without it."""

    name: str = ""
    title: str = ""  # as pages and logs name it: "DFlash", "EAGLE-3"
    chain: bool = False  # drafts one token after another (a chain), not a block in parallel
    # the demo's train options (`draftdeck demo --drafter NAME`): 7 drafts a step for every kind
    demo: Mapping[str, Any] = {}

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

    def source(self, drafter: Any, target: Any, block: int) -> Any:
        """The drafter as a draft source of real decoding (draftdeck.drafter.eval.spec_decode)."""
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

    def export(self, drafter: Any, out: Path, fmt: str, verifier: str | None) -> Path:
        """Write `drafter` to `out` in `fmt` (one of `formats`), atomically."""
        raise NotImplementedError

    def served(self, folder: Path, fmt: str, target: str | None, block: int) -> list[dict[str, Any]]:
        """How each server's loader reads an export of a drafter trained for `block` (its `problems`:
        where it reads it otherwise than trained), and the `flags` that launch it."""
        raise NotImplementedError

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


def get_kind(name: str) -> DrafterKind:
    """The drafter kind called `name` (UsageError naming the kinds there are)."""
    if name not in PACKAGES:
        raise UsageError(f"drafter kind {name!r}: one of {', '.join(NAMES)}")
    kind: DrafterKind = import_module(PACKAGES[name]).KIND
    return kind


def kind_of_config(config: Mapping[str, Any], where: object) -> DrafterKind:
    """The kind whose drafter a folder's config.json describes (UsageError when none owns it)."""
    for name in NAMES:
        kind = get_kind(name)
        if kind.owns(config):
            return kind
    raise UsageError(f"{where}: a drafter config of no kind DraftDeck knows ({', '.join(NAMES)})")
