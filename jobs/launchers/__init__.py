"""Launchers run job attempts somewhere: ``local`` (a subprocess on this machine) or ``kubernetes``.

This package's ``base`` and ``supervise`` modules import nothing from Django, so the supervisor
process stays small; ``registry.get_launcher()`` picks the configured launcher.
"""
