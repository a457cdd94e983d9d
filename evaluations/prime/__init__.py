"""Prime Intellect's evaluation API over Lab's evaluations, so that ``prime eval`` (``prime==0.18.0``)
and the ``prime-evals`` SDK (0.2.4) drive Lab: hosted runs, pushes of local ``vf-eval`` results,
and reads. Mounted at ``/prime/api/v1/`` before the jobs app's Prime routes (``lab/urls.py``);
docs/prime-compat.md lists what each command maps to.
"""
