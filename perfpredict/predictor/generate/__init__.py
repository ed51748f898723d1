"""The generation (vLLM) part of the predictor: predictions for generation scenarios (`predict`) and the ranking
of TP / PP / replica layouts, its emitter and the online-DPO device split (`rank`)."""
