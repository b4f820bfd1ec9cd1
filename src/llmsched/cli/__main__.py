"""`python -m llmsched.cli ...`: the same as `llmsched ...`."""

import sys

from . import main

sys.exit(main())
