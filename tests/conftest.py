import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one torch thread per pytest-xdist worker (and per process a test launches): two workers at two
    # threads each on two cores run many times slower than at one; set before torch is imported
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("HPSE_DATA_DIR", REPO.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.skip(f"benchmark data not found at {path}; set HPSE_DATA_DIR")
    return path


@pytest.fixture
def gate_always_open(monkeypatch):
    """Let a test set tau below its valid range (tau >= 0), to force the step-in gate open at every
    token.

    The paper's tau is a log-probability margin >= 0 and hparams reject anything else; tests that
    need the teacher to write the whole rollout (tau=-1e9, kappa=0) ask for this fixture.
    """
    from hpse_easyedit import hparams

    strict = hparams._validated

    def lenient(cls, values, source):
        tau = values.get("tau")
        if isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau < 0:
            return {**strict(cls, {**values, "tau": 0.0}, source), "tau": float(tau)}
        return strict(cls, values, source)

    monkeypatch.setattr(hparams, "_validated", lenient)


@pytest.fixture(scope="module")
def he():
    """``hpse_easyedit.easyedit`` on a real EasyEdit checkout (``$EASYEDIT_SRC``); skipped with the
    reason without one."""
    if not os.environ.get("EASYEDIT_SRC"):
        pytest.skip(
            "EASYEDIT_SRC is not set: point it at an EasyEdit source checkout (git clone "
            "https://github.com/zjunlp/EasyEdit) to run the tests that drive EasyEdit's BaseEditor"
        )
    import hpse_easyedit.easyedit as he

    return he


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """BaseEditor writes ./logs; MEMIT/AlphaEdit write ./data/stats: keep both in the test's
    directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def another_writer_first(monkeypatch):
    """Arm ``os.replace`` so that, just before the first rename whose source ``matches``, another
    thread runs ``write_again`` (a whole write of the same target); returns a list that holds True
    once that happened."""

    def arm(write_again, matches=lambda src: True):
        import threading

        real_replace, done = os.replace, []

        def replace(src, dst):
            if not done and matches(str(src)):
                done.append(True)
                thread = threading.Thread(target=write_again)
                thread.start()
                thread.join()
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        return done

    return arm
