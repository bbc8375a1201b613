"""The data path: sources -> prepare (WAVs + metadata) -> corpus (clips in RAM) -> features
(spectrograms) -> sampler (length buckets) -> feed (micro-batches).

May import finetune.system only.
"""
