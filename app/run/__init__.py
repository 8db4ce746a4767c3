"""Running jobs: claim, run, record the outcome; chunks, resume, leftovers, the sweeper and liveness."""
