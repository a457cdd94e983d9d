"""``python -m environments.builder build ...``: see ``environments.builder.build.main``."""

import sys

from environments.builder.build import main

sys.exit(main())
