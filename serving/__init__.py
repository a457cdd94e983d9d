"""Deployments: checkpoints, adapters and catalogue models served behind an OpenAI-compatible API
(docs/serving.md)."""
