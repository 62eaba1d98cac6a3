"""``benchmarks.markdown``: the one table helper every table of the wing is built from."""

import pytest

from benchmarks.markdown import md_row, md_rule, md_table


def test_a_table_has_a_header_a_rule_and_a_row_per_row():
    assert md_table(["run", "Avg"], [["LoRA", "50.0"], ["HPSE", 46.2]], "lr") == [
        "| run | Avg |",
        "|---|---:|",
        "| LoRA | 50.0 |",
        "| HPSE | 46.2 |",
    ]
    assert md_row(["", "x", ""]) == "|  | x |  |"
    assert md_rule("rll") == "|---:|---|---|"


def test_a_wrong_alignment_is_refused():
    with pytest.raises(ValueError, match="align names 1 columns, the header 2"):
        md_table(["a", "b"], [], "l")
    with pytest.raises(ValueError, match="'l' and 'r'"):
        md_rule("lc")
