"""The real vLLM engine generating -> generate.parquet: generate (groups, layouts, sessions, rows) and worker (one
engine replica driven over stdin/stdout, under the interpreter that has vLLM)."""
