"""Where inference servers run: behind ``ServerRuntime`` (base.py); locally as supervised engine
processes (local.py)."""
