"""The OpenAI-compatible API in front of deployments, ``/api/v1/openai/v1/...`` (docs/serving.md): an HTTP edge."""
