"""predictor stage."""
