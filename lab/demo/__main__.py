"""``python -m lab.demo``: run the main job end to end (see :mod:`lab.demo`)."""

from lab.demo.program import main

raise SystemExit(main())
