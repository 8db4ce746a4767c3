"""The base every job kind builds on: the parameter base class (params.py) and the context a run gets
(context.py). Each kind's parameter model and run function live with their stage (convert/job.py,
drafter/train/run.py, ...); the table of kinds is draftdeck/kinds.py, at the top of the core."""
