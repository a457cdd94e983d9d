"""Environment packages per organization: uploaded wheels, their metadata and versions.

Lab reads a package's metadata from the wheel's zip and never imports its code (``wheels``);
the engine installs and imports it inside a job. This app never imports ``jobs``: jobs call its
services and refer to packages by id.
"""
