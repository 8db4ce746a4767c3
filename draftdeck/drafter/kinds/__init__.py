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
from typing import TYPE_CHECKING, Any, Literal

from draftdeck.drafter.kinds.base import DrafterKind, KindOptions, size_problems
from draftdeck.drafter.kinds.dflash.options import DFlashOptions
from draftdeck.drafter.kinds.dflash2.options import DFlash2Options
from draftdeck.drafter.kinds.dspark.options import DSparkOptions
from draftdeck.drafter.kinds.eagle3.options import Eagle3Options, Eagle3VocabOptions
from draftdeck.drafter.kinds.mtp.options import MTPOptions
from draftdeck.drafter.kinds.peagle.options import PEagleOptions
from draftdeck.errors import UsageError

__all__ = ["NAMES", "DrafterKind", "DrafterName", "KindOptions", "Options", "get_kind", "kind_of_config",
           "size_problems"]  # fmt: skip

PACKAGES: dict[str, str] = {
    "dflash": "draftdeck.drafter.kinds.dflash",
    "eagle3": "draftdeck.drafter.kinds.eagle3",
    "dflash2": "draftdeck.drafter.kinds.dflash2",
    "dspark": "draftdeck.drafter.kinds.dspark",
    "peagle": "draftdeck.drafter.kinds.peagle",
    "mtp": "draftdeck.drafter.kinds.mtp",
}
NAMES: tuple[str, ...] = tuple(PACKAGES)


class Options(
    DFlashOptions, Eagle3Options, Eagle3VocabOptions, DFlash2Options, DSparkOptions, PEagleOptions, MTPOptions
):
    """Every kind's options, as the train job's parameters take them (a kind's line here too)."""


if TYPE_CHECKING:
    DrafterName = str
else:  # the parameter models' choices (train's `drafter`, plan's): every kind by name
    DrafterName = Literal[NAMES]


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
