"""Why a server's scheduler has no guarantee of stability inside the region: reasons
that carry their kind, so that callers group them without reading their text."""

from __future__ import annotations

from dataclasses import dataclass

#: a batch policy neither work-conserving nor adaptive, or an unknown one (its name)
POLICY = "policy"
#: an admission that paces or caps, a running cap, back-pressure control, a finite kv_capacity
HELD = "held"
#: a binding k_max under a work-conserving policy (`k_max 16 < b_max 512`)
CAP = "cap"
#: a work-conserving policy whose full steps of b_max serve less than smaller steps do:
#: b / t(b) peaks below b_max (`b / t(b) peaks at b = 512 < b_max 600`)
FILL = "fill"
#: adaptive on a region that is only an upper bound (`region_exact` false: chunk integrality
#: can bind, so lambda* may lie above what any policy serves)
REGION = "region"
#: adaptive planning with its own `cost` option, a model other than the run's: it picks
#: the steps of another region, whose rates the run's steps need not serve
COST = "cost"


@dataclass(frozen=True)
class HoldReason:
    """One reason, `kind` POLICY, HELD, CAP or FILL; `str()` is its `text`, the words users see."""

    kind: str
    text: str

    def __str__(self) -> str:
        return self.text


def reasons_text(reasons) -> str:
    """The reasons as users read them: `k_max 16 < b_max 512, twp admission` ("" for none)."""
    return ", ".join(map(str, reasons))
