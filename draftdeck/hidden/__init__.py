"""Hidden states as data, on disk: the cache's safetensors shards and manifest (`store`) and the
named checks a cached row passes (`checks`). Built by the `cache-hidden` job (draftdeck.drafter.train.cache),
read by a run from the cache (draftdeck.drafter.model.cached_target) without the target's decoder
layers. Below the drafter: it imports none of it."""
