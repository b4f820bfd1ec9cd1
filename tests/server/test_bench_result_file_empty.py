"""`bench --result-file ''` ran to exit 0 and wrote nothing; `--metadata` and
`--save-detailed` beside it passed their "does nothing: no result file" check."""

from __future__ import annotations

import pytest

from llmsched.cli import main


@pytest.mark.parametrize("extra", [[], ["--metadata", "a=1"], ["--save-detailed"]])
def test_an_empty_result_file_is_refused(capsys, extra):
    # (port 1: nothing listens there; the check comes before any connection)
    rc = main(["bench", "--port", "1", "--num-prompts", "1", "--result-file", "", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "llmsched bench: error: --result-file: give a file name, got ''", err
