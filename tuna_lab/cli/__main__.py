"""``python -m tuna_lab.cli``: ``tuna-lab`` run by module, as the tests and the solver bench do."""

import sys

from . import main

sys.exit(main())
