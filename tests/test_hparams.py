"""HPSEHyperParams: every shipped YAML loads; bad keys, types and values name the key and the
file."""

import os
import re
import time
from pathlib import Path

import pytest

from hpse_easyedit import HParamsError, HPSEHyperParams
from hpse_easyedit.hparams import parse_overrides

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "hparams" / "HPSE").glob("*.yaml"))


def test_all_four_backbones_and_smollm_are_shipped_with_both_executors():
    names = {p.stem for p in SHIPPED}
    for stem in ("qwen2.5-7b", "qwen3-8b", "llama3.1-8b", "gemma2-9b", "smollm2-135m"):
        assert stem in names and f"{stem}-ftm" in names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_yaml_loads(path):
    hp = HPSEHyperParams.from_hparams(path)
    assert hp.alg_name == "HPSE" and hp.model_name
    if path.stem.endswith("-ftm"):
        assert hp.executor == "ft_m"
        assert hp.ftm_layer == (16 if path.stem.startswith("llama") else 8)
    else:
        assert hp.executor == "lora" and hp.lora_rank == 12 and hp.lora_alpha == 24
    if not path.stem.startswith("smollm2"):  # the paper's values on its four backbones
        assert (hp.tau, hp.kappa, hp.top_k, hp.nll_weight, hp.rounds, hp.inner_steps, hp.lr) == (
            2.0,
            0.3,
            16,
            1.0,
            5,
            8,
            1e-4,
        )
        assert hp.dtype == "bfloat16"


def test_defaults_are_the_papers():
    hp = HPSEHyperParams(model_name="m")
    assert (hp.tau, hp.kappa, hp.top_k, hp.nll_weight, hp.kl_weight) == (2.0, 0.3, 16, 1.0, 1.0)
    assert (hp.rounds, hp.inner_steps, hp.lr, hp.adam_betas, hp.weight_decay) == (
        5,
        8,
        1e-4,
        [0.9, 0.999],
        0.0,
    )
    assert hp.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert hp.editing_prompt == "Introduce {subject}."
    assert hp.max_new_tokens == 96 and hp.layers is None


def _write(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("model_name: m\nlearning_rate: 0.1\n", "unknown key(s) ['learning_rate']"),
        ("model_name: m\nrounds: five\n", "key 'rounds' must be int"),
        ("model_name: m\nrounds: 0\n", "key 'rounds' must be >= 1"),
        ("model_name: m\nkappa: 1.5\n", "key 'kappa' must be < 1.0"),
        ("model_name: m\nlr: 0\n", "key 'lr' must be > 0"),
        ("model_name: m\nexecutor: adapter\n", "key 'executor' must be one of ['lora', 'ft_m']"),
        ("model_name: m\nrollout: sampled\n", "key 'rollout' must be one of"),
        ("model_name: m\nalg_name: ROME\n", "alg_name must be 'HPSE'"),
        ("model_name: m\nmodel_parallel: 1\n", "key 'model_parallel' must be bool"),
        ("model_name: m\ntop_k: true\n", "key 'top_k' must be int, got a boolean"),
        ("model_name: m\nediting_prompt: Introduce it.\n", "must contain '{subject}'"),
        ("model_name: m\nadam_betas: [0.9]\n", "key 'adam_betas' must have 2 entries"),
        ("model_name: m\nlayers: [1, -2]\n", "key 'layers' must be null"),
        ("model_name: ''\n", "key 'model_name' must not be empty"),
        ("- a\n- b\n", "expected a mapping"),
        ("model_name: [unclosed\n", "not valid YAML"),
        ("model_name: m\ntau: -3\n", "key 'tau' must be >= 0.0"),
        ("model_name: m\ntau: .inf\n", "key 'tau' must be a finite number"),
        ("model_name: m\nkappa: 1.0\n", "key 'kappa' must be < 1.0"),
        ("model_name: m\ntop_k: 0\n", "key 'top_k' must be >= 1"),
        ("model_name: m\nlr: 1.0e-3\nrounds: 2\nlr: 5.0e-4\n", "key 'lr' is given twice (lines 2"),
        (
            "model_name: m\nchat_template_kwargs: {enable_thinking: false, enable_thinking: 1}\n",
            "key 'enable_thinking' is given twice",
        ),
        (
            "model_name: m\nediting_prompt: 'About {subject} in {lang}.'\n",
            "key 'editing_prompt' must hold the placeholder {subject} and no other, got {lang}",
        ),
        ("model_name: m\nediting_prompt: 'About {subject} }'\n", "Single '}' encountered"),
        ("model_name: m\nediting_prompt: 'About {{subject}}.'\n", "got no {subject} placeholder"),
    ],
)
def test_bad_files_name_key_and_file(tmp_path, text, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(HParamsError) as err:
        HPSEHyperParams.from_hparams(path)
    assert fragment in str(err.value)
    assert str(path) in str(err.value)


def test_a_literal_brace_and_a_merge_override_are_fine(tmp_path):
    hp = HPSEHyperParams.from_hparams(
        _write(
            tmp_path,
            "model_name: m\n<<: {rounds: 3}\nrounds: 2\nediting_prompt: '{{x}} {subject}'\n",
        )
    )
    assert hp.rounds == 2 and hp.editing_prompt.format(subject="s") == "{x} s"


def test_an_alias_bomb_is_one_line_at_once(tmp_path):
    """Nine aliases of nine aliases ... stand for 9**9 values; the file itself is 1 kB."""
    lines = ["model_name: m", "chat_template_kwargs:", "  a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(8):
        prev, name = chr(97 + i), chr(98 + i)
        lines.append(f"  {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    path = _write(tmp_path, "\n".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(HParamsError, match="anchors and aliases .* stand for more than 10,000"):
        HPSEHyperParams.from_hparams(path)
    assert time.perf_counter() - start < 2
    with pytest.raises(HParamsError, match="--set chat_template_kwargs: its anchors and aliases"):
        HPSEHyperParams(model_name="m").with_overrides(
            ["chat_template_kwargs={" + ", ".join(lines[2:]).replace("  ", "") + "}"]
        )


@pytest.mark.parametrize("kind", ["fifo", "symlink loop", "device"])
def test_an_hparams_path_that_is_no_regular_file_is_one_line(tmp_path, kind):
    """A FIFO would block the read forever, a symlink loop raised OSError, /dev/zero never ends."""
    path = tmp_path / "hp.yaml"
    if kind == "fifo":
        os.mkfifo(path)
        why = "is not a regular file (a FIFO, device or socket)"
    elif kind == "symlink loop":
        path.symlink_to(path)
        why = "cannot be read (Too many levels of symbolic links)"
    else:
        path = "/dev/zero"
        why = "is not a regular file"
    with pytest.raises(HParamsError, match=re.escape(f"{path}: {why}")):
        HPSEHyperParams.from_hparams(path)


def test_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(HParamsError, match="no such hparams file"):
        HPSEHyperParams.from_hparams(tmp_path / "nope.yaml")


def test_yaml_is_read_safely(tmp_path):
    path = _write(tmp_path, "model_name: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(HParamsError, match="not valid YAML"):
        HPSEHyperParams.from_hparams(path)


def test_overrides_are_typed_and_validated():
    hp = HPSEHyperParams(model_name="m")
    new = hp.with_overrides(["kl_weight=0", "layers=[0, 2]", "rollout=on_policy", "lr=5e-4"])
    assert new.kl_weight == 0.0 and isinstance(new.kl_weight, float)
    assert new.layers == [0, 2] and new.rollout == "on_policy" and new.lr == 5e-4
    assert hp.kl_weight == 1.0  # the original is untouched
    with pytest.raises(HParamsError, match="--set overrides: key 'tau' must be float"):
        hp.with_overrides(["tau=high"])
    with pytest.raises(HParamsError, match="expected key=value"):
        parse_overrides(["tau"])
    assert hp.with_overrides({"rounds": 2}).rounds == 2


def test_round_trip_yaml(tmp_path):
    hp = HPSEHyperParams(
        model_name="m", executor="ft_m", chat_template_kwargs={"enable_thinking": False}
    )
    hp.to_yaml(tmp_path / "x.yaml")
    assert HPSEHyperParams.from_hparams(tmp_path / "x.yaml") == hp


def test_executor_choices_come_from_the_registry(monkeypatch):
    """A new executor is one class plus one registration: the hparams accept its name, and an
    unknown name's message lists the registry."""
    from hpse_easyedit.coin import COINHyperParams
    from hpse_easyedit.executors import EXECUTORS, Executor, make_executor

    class ToyExecutor(Executor):
        name = "toy"

    unknown = r"key 'executor' must be one of \['lora', 'ft_m'\], got 'toy'"
    with pytest.raises(HParamsError, match=unknown):
        HPSEHyperParams(model_name="m", executor="toy")
    monkeypatch.setitem(EXECUTORS, "toy", ToyExecutor)
    hp = HPSEHyperParams(model_name="m").with_overrides(["executor=toy"])
    assert hp.executor == "toy" and type(make_executor(object(), hp)) is ToyExecutor
    assert COINHyperParams(model_name="m", executor="toy").executor == "toy"
    unknown = (
        r"--set overrides: key 'executor' must be one of \['lora', 'ft_m', 'toy'\], "
        r"got 'adapter'$"
    )
    with pytest.raises(HParamsError, match=unknown):
        hp.with_overrides(["executor=adapter"])


def test_a_field_declaration_with_an_unknown_check_is_refused():
    from hpse_easyedit.hparams import hp_field

    with pytest.raises(TypeError, match=r"hp_field: unknown check\(s\) \['maximum'\]"):
        hp_field(1, "A count.", maximum=3)


def test_each_field_is_checked_once_its_type_is_right(tmp_path):
    """The file's first wrong field (in declaration order) is the one named; a value of the wrong
    type is named as that, not as an out-of-range or unlisted value."""
    path = _write(tmp_path, "model_name: m\nrollout: 3\ntau: -1\nlr: '5e-4'\n")
    with pytest.raises(HParamsError) as err:
        HPSEHyperParams.from_hparams(path)
    assert str(err.value) == f"{path}: key 'tau' must be >= 0.0, got -1.0"
    path = _write(tmp_path, "model_name: m\nrollout: 3\nfast_decode: 1\n")
    with pytest.raises(HParamsError) as err:
        HPSEHyperParams.from_hparams(path)
    assert str(err.value).startswith(f"{path}: key 'rollout' must be str, got int 3 (")
    with pytest.raises(HParamsError, match=r"key 'fast_decode' must be bool/str, got int 1 \("):
        HPSEHyperParams(model_name="m", fast_decode=1)
    assert HPSEHyperParams(model_name="m", lr="5e-4", device=1).lr == 5e-4


def test_unknown_keys_of_several_types_are_one_line(tmp_path):
    path = _write(tmp_path, "model_name: m\n1: x\nlearning_rate: 0.1\n")
    with pytest.raises(HParamsError, match=r"unknown key\(s\) \['learning_rate', 1\]; remove them"):
        HPSEHyperParams.from_hparams(path)
    path = _write(tmp_path, "model_name: m\n10: x\n9: y\n")
    with pytest.raises(HParamsError, match=r"unknown key\(s\) \[9, 10\]; remove them"):
        HPSEHyperParams.from_hparams(path)
