"""Job kinds: each kind's one parameter model and run function, and the context a run gets."""
