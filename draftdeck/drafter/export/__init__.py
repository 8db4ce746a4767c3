"""The drafter exported for serving, and what each server's loader reads of it."""
