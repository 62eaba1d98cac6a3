"""Every analysis entry point of benchmarks/ turns an argparse mistake into one stderr line and exit
code 2."""

import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "benchmarks.analysis.paired",
        "benchmarks.analysis.study",
        "benchmarks.analysis.inspect_rollout",
        "benchmarks.report.__main__",
        "benchmarks.perf",
        "hpse_easyedit.demo",
    ],
)
def test_an_unknown_option_is_one_line_and_exit_2(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-option"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and err.startswith("error: ")
        and "--help" in err
        and "usage:" not in err
    )
