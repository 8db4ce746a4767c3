"""Training a drafter: data, objective, the trainer's loop, checkpoints, ranks, memory, truth."""
