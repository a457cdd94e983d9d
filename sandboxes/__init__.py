"""Sandboxes: isolated places where users' and environments' untrusted code runs (docs/sandboxes.md).

The control plane (create, get, list, delete, quotas, reaping) is ``sandboxes.services``; the
runtime that holds a sandbox's processes and files is behind ``sandboxes.runtime.base``.
"""
