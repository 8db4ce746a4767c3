"""The drafter's model: its config, the frozen target's view, attention and the LM head."""
