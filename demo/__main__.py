"""``python -m demo``: run the main job end to end (see :mod:`demo`)."""

from demo.program import main

raise SystemExit(main())
