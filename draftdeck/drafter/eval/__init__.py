"""Evaluating a drafter by real speculative decoding, beside baselines and the training estimate."""
