"""The benchmark wing's one command line (``python -m benchmarks COMMAND``), its rooms (a room
imports only the rooms below it) and the modules' old paths, kept for one release."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import COMMANDS, main
from benchmarks._moved import MOVED

REPO = Path(__file__).resolve().parents[1]
WING = REPO / "benchmarks"
#: bottom to top: a module may import its own room and the rooms before it in this list
ROOMS = ["records", "tasks", "run", "analysis", "report"]
#: perf stands apart: it may import these, and no other room imports it
PERF_READS = {"records", "tasks", "run", "perf"}


def test_the_bare_command_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_its_help_under_the_one_entry_point(name, capsys):
    args = [name, "mquake-uns", "--help"] if name == "run" else [name, "--help"]
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 0
    usage = capsys.readouterr().out.splitlines()[0]
    prog = (
        "python -m benchmarks run mquake-uns" if name == "run" else f"python -m benchmarks {name}"
    )
    assert usage.startswith(f"usage: {prog} ")


def test_a_wrong_command_or_benchmark_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["nope"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice: 'nope'" in err[0]
    assert main(["run", "mquke-uns", "--hparams", "x.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: 'mquke-uns' is not a benchmark: name one of unkebench, mquake-uns first; see "
        "python -m benchmarks run --help"
    ]


def test_a_command_reports_a_bad_input_in_one_line(tmp_path, capsys):
    assert main(["twin", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_moved_module_itself(old):
    assert importlib.import_module(f"benchmarks.{old}") is importlib.import_module(
        f"benchmarks.{MOVED[old]}"
    )


@pytest.mark.slow
def test_an_old_command_path_runs_the_command():
    """``python -m benchmarks.paired`` (the path before the rooms) runs the paired command."""
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, *a], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    old, new = run("-m", "benchmarks.paired", "--help"), run("-m", "benchmarks", "paired", "--help")
    assert old.returncode == new.returncode == 0 and old.stdout == new.stdout
    assert old.stderr == ""  # no warning about a module found in sys.modules before it ran


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[0] == "benchmarks") else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``benchmarks`` import of a file of the wing."""
    package = list(path.relative_to(REPO).parts[:-1])  # the file's package, __init__ or not
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("benchmarks"):
                found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("benchmarks")]
    return found


def test_each_room_imports_only_the_rooms_below_it():
    climbs = []
    for path in sorted(WING.rglob("*.py")):
        rel = path.relative_to(WING).parts
        if len(rel) < 2:  # the wing's own __init__, __main__ and _moved
            continue
        room = rel[0]
        for line, target in _imports(path):
            to = _room(target)
            if to is None or to == room or to == "markdown":  # the wing-level table helper
                continue
            allowed = PERF_READS if room == "perf" else set(ROOMS[: ROOMS.index(room)])
            if to not in allowed:
                climbs.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert climbs == []


@pytest.mark.slow  # a Python subprocess importing the runner: about 6 s
def test_a_mquake_uns_run_never_loads_the_mmlu_code():
    code = (
        "import sys; import benchmarks.run.runner, benchmarks.run.cli; "
        "from benchmarks.tasks import TASKS; "
        "p = TASKS['mquake-uns'].locality_probe({'mmlu_n': 100}, None, None); "
        "print(type(p).__name__, 'benchmarks.tasks.mmlu' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.stdout.split() == ["NoProbe", "False"], out.stderr


def test_the_engine_imports_nothing_of_the_benchmarks():
    engine = REPO / "hpse_easyedit"
    found = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in sorted(engine.rglob("*.py"))
        for line, target in _imports(path)
    ]
    assert found == []
