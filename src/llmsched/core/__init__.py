"""Domain model: requests, step plans, server state, constraints and step cost models."""

from .constraints import Constraints
from .cost import CostModel, LinearCostModel, PaperCostModel, make_cost_model
from .errors import ConfigError
from .plan import StepFeedback, StepPlan
from .request import DECODE, DONE, PREFILL, WAITING, Request
from .state import UNLIMITED, ServerState, WaitingQueue

__all__ = [
    "Constraints",
    "CostModel",
    "LinearCostModel",
    "PaperCostModel",
    "make_cost_model",
    "ConfigError",
    "StepFeedback",
    "StepPlan",
    "DECODE",
    "DONE",
    "PREFILL",
    "WAITING",
    "Request",
    "UNLIMITED",
    "ServerState",
    "WaitingQueue",
]
