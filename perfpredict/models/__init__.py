"""The learned models, in one place that both `train` (fits them) and `predictor` (applies them) import: kernel
models, the kernel composition of a step, the plan-level corrections with their applicability domain, intervals and
the OOM margin, and the saved bundle. Nothing here imports torch."""
