"""perfpredict: a learned performance predictor for distributed LLM training and preference tuning."""

__version__ = "0.1.0"
