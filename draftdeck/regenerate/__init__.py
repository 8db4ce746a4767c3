"""Regeneration: the target model answers the prompts (OpenAI-compatible servers or local
transformers), every answer checked, written resumably and in input order.

Entry points: :class:`RegenerateParams` and :func:`run_regenerate` (the job), and
``draftdeck regenerate`` (draftdeck/cli/regenerate.py, options derived from the parameters).
"""

from draftdeck.regenerate.params import RegenerateParams
from draftdeck.regenerate.run import run_regenerate

__all__ = ["RegenerateParams", "run_regenerate"]
