"""Test session set-up: named datasets resolve to the shared traces, or to the excerpts
in tests/data/traces on machines without ../shared (a clean CI checkout elsewhere)."""

import os

import pytest
from helpers import TRACES

os.environ.setdefault("LLMSCHED_TRACES", str(TRACES))


@pytest.fixture
def saved_figures(monkeypatch):
    """Every figure the analysis saves (`figures.save_figure`), by file name; still written."""
    from llmsched.analysis import figures

    saved = {}
    real = figures.save_figure

    def save(fig, path):
        saved[path.name] = fig
        return real(fig, path)

    monkeypatch.setattr(figures, "save_figure", save)
    return saved
