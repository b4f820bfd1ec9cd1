"""Tags a trace CSV cannot hold are refused when written, not when read back."""

from __future__ import annotations

import pytest

from llmsched.core.errors import ConfigError
from llmsched.workload import Trace, read_trace
from llmsched.workload.spec import WorkloadClass


def test_a_tag_with_a_carriage_return_is_refused(tmp_path):
    """A reader ends a line at a lone \\r: to_csv wrote a file reading refused as malformed."""
    t = Trace([0.0, 1.0, 2.0], [5, 6, 7], [1, 2, 3], tag=["a\rb", "c", "d"])
    with pytest.raises(ConfigError, match="carriage returns"):
        t.to_csv(tmp_path / "t.csv")
    assert not (tmp_path / "t.csv").exists()
    with pytest.raises(ConfigError, match="carriage returns"):
        WorkloadClass("a\rb")
    ok = Trace([0.0, 1.0], [5, 6], [1, 2], tag=["a b", "c"])
    ok.to_csv(tmp_path / "ok.csv")
    assert read_trace(tmp_path / "ok.csv") == ok
