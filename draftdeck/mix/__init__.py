"""Mixing: a recipe of named sources, each with a quota, a weight or all of it, into one converted file
whose every row names its source (``draftdeck_source.source``), with a composition table that balances.

- :mod:`draftdeck.mix.recipe`: the recipe (YAML, the form, the API: one model), errors by line
- :mod:`draftdeck.mix.plan`: the rows each source gives, as exact integers
- :mod:`draftdeck.mix.rows`: the facts, filters and duplicate key of one converted row
- :mod:`draftdeck.mix.run`: convert each source, count, deduplicate, draw and write
"""

from draftdeck.mix.plan import plan_rows
from draftdeck.mix.recipe import MixSource, Recipe
from draftdeck.mix.run import check_recipe_out, mix

__all__ = ["MixSource", "Recipe", "check_recipe_out", "mix", "plan_rows"]
