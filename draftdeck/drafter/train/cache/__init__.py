"""The `cache-hidden` job: the target runs once over a tokenized dataset and its hidden states are
stored as a cache (`build`), or speculators' and vLLM's offline files are taken in or written
(`formats`). The cache's files and checks are draftdeck.hidden's, below the drafter, so that the
trainer's cached target (draftdeck.drafter.model.cached_target) reads them."""
