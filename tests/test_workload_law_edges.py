"""Length laws a bug hunt found drawn wrongly or answered with a traceback."""

from __future__ import annotations

import numpy as np
import pytest

from llmsched.workload.lengths import Lognormal, parse_length_law


@pytest.mark.parametrize("cv", [1e-9, 1e-163, 1e-300])
def test_a_lognormal_law_of_a_tiny_cv_draws_its_mean(cv):
    """cv**2 underflowed to 0 below about 1e-162: a log-sd of 0, and `lognormal:mean=100,
    cv=1e-200` was a ZeroDivisionError (a traceback on the CLI)."""
    law = parse_length_law(f"lognormal:mean=100,cv={cv}")
    assert law.log_sigma == pytest.approx(cv, rel=1e-12)
    assert np.all(law.sample(np.random.default_rng(0), 1000) == 100)
    assert law.expected() == pytest.approx(100.0)
    assert Lognormal(100, cv=0.5).log_sigma == pytest.approx(np.sqrt(np.log1p(0.25)), rel=1e-15)
