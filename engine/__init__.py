"""Lab's RL engine: the program every Lab job runs.

`python -m engine run ...` trains a policy with GRPO on one of the catalogue's models and
environments and reports to Lab through the ingest API (docs/ingest-api.md). This package never
imports Django, and importing it (or `engine.catalog`) does not import torch: the server
reads the catalogues from here.
"""
