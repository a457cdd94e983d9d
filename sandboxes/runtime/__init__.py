"""Runtimes that hold sandboxes: the interface (``base``) and the local bubblewrap one (``local``)."""
