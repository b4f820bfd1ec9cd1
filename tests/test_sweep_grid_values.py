"""`llmsched sweep --grid`: values that are the same point however spelt, how values with
commas are written, and how grid values appear in the tables."""

import pytest

from llmsched.analysis.grid import parse_grid
from llmsched.cli import main
from llmsched.core.errors import ConfigError

ARGV = ["sweep", "--cost-model", "paper", "--num-requests", "50", "--no-plots", "--no-progress", "--workers", "1"]


@pytest.mark.parametrize(
    "spec, said",
    [
        ("prompt=geometric:200|geometric:mean=200", "'geometric:mean=200' is the same law as 'geometric:200'"),
        ("prompt=const:100|const:100.0", "'const:100.0' is the same law as 'const:100'"),
        ("output=100,const:100", "'const:100' is the same law as 100"),
        ("turns=geom:2|geometric:mean=2", "the same law as 'geom:2'"),
        ("system_prompt=0,none", "the value None is the same value as 0"),
    ],
)
def test_a_value_spelt_two_ways_is_refused(tmp_path, capsys, spec, said):
    """Each ran twice ("2 points: 2 simulated", identical rows): only policies, cost
    models and mappings were compared by what they run."""
    assert main([*ARGV, "--grid", spec, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
    assert not (tmp_path / "s").exists()


def test_different_laws_stay_apart_and_a_mapping_law_is_compared():
    g = parse_grid(["prompt=geometric:200|geometric:mean=200,max=4000|uniform:1,400", "system_prompt=0,1"])
    assert len(g["prompt"]) == 3 and g["system_prompt"] == [0, 1]
    with pytest.raises(ConfigError, match="same law"):
        parse_grid({"prompt": ["geometric:200", {"law": "geometric", "mean": 200}]})
