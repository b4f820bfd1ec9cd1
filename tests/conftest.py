"""Test session set-up: named datasets resolve to the shared traces, or to the excerpts
in tests/data/traces on machines without ../shared (a clean CI checkout elsewhere)."""

import os

from helpers import TRACES

os.environ.setdefault("LLMSCHED_TRACES", str(TRACES))
