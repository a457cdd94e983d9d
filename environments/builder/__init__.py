"""The environment builder: one pushed version's wheel in, a lock, a wheelhouse and a summary out.

Run as a subprocess (``python -m environments.builder build ...``, ``environments.builds`` starts
it), never inside Lab's web or worker process: it installs the package and imports it. It does
not import Django; it reads and writes plain files and prints its log on stdout. Steps
(``environments.builder.build``):

1. read the wheel's metadata (``environments.wheels``) and refuse a ``Requires-Python`` the
   engine's Python does not meet;
2. resolve its ``Requires-Dist`` closure for the engine's Python with uv against the configured
   package index, as of the version's push time (``--exclude-newer``), with
   ``verifiers<0.4`` for a ``load_environment`` module that exports no ``Taskset``; the
   engine's own pins are no part of it (the package gets an environment of its own);
3. build a wheel of each locked source archive (``uv build --wheel``, its build backend from the
   same index; reused from the wheelhouse when built from the same archive before), then fetch
   each locked wheel into the content-addressed wheelhouse (``<sha256>/<file name>``, shared
   between builds: a wheel already there is not fetched again), checking its SHA-256;
4. create a fresh virtual environment (``uv venv``), install the lock from the wheelhouse
   offline, then the package itself;
5. import the module and load the environment with its defaults in that environment
   (``engine.environments.probe``, a script of the standard library only), recording what it
   found (the summary).

The result file is JSON: ``{"status": "ready"|"failed", "error": str|None, "python": "3.11.7",
"lock": [{"name", "version", "filename", "sha256"}], "summary": {...}}``.
"""
