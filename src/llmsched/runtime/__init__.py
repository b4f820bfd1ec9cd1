"""The one runtime: the step loop every online driver runs (`StepDriver`: plan -> execute
-> account -> feedback) and the one stop checker (`Sequence`). No torch here."""

from .driver import Executor, StepBatch, StepDriver
from .output import Sequence

__all__ = ["StepDriver", "StepBatch", "Executor", "Sequence"]
