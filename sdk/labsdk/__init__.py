"""Lab's Python SDK: job specs (:mod:`labsdk.spec`), the API client and the ``lab`` CLI."""
