"""The real TRL trainers -> trl.parquet: grid (sampled configs), data (tokenizer, random-weight Llama, synthetic
preference data), trainers (building DPO/CPO/ORPO/KTO trainers per backend), measure (step timing and memory
callbacks), worker (one launch's configs, one process per rank), schema (result -> row), collect (launching,
resuming, appending)."""
