"""The names eval.json keeps its figures under, for the code that only reads them: the leaderboard
(app/store/leaderboard.py) and the CLI's table. Kept apart from the decoding (spec_decode.py, tally.py,
suite_eval.py), which imports torch and transformers: the web app imports this module, and must
start where the `train` extra (torch) is not installed."""

from __future__ import annotations

ALL = "(all)"  # a suite's figures over every category (a user's category cannot be named so)
