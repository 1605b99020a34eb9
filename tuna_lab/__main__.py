"""``python -m tuna_lab ...``: the ``tuna-lab`` command, for when only the interpreter is known."""

import sys

from .cli import main

sys.exit(main())
