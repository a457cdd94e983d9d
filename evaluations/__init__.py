"""Evaluations: a model or a checkpoint scored on environments by an evaluation job, every sample
kept, with results per environment (docs/evaluations.md)."""
