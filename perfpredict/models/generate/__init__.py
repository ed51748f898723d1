"""The generation (vLLM) part of the learned models: the engine-step composition from the kernel models
(`compose`) and the learned correction with its intervals (`model`)."""
