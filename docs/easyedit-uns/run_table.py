"""The table of docs/EASYEDIT.md, "EasyEdit's unstructured example": EasyEdit's own
``examples/run_AKEW_both.py`` loop (``run_unstructured_editing``) and ``eval_akew_unstructured`` on
the embedded SmolLM2-135M, with HPSE added to ``UNSTRUCTURED_ALG_DICT`` by the line docs/EASYEDIT.md
gives, beside EasyEdit's ``LoRA_uns`` and ``FT_uns`` and the unedited model.

Every method edits each record from the unedited model: the script is run once per record, on a
data directory holding that record alone, because its own loop never undoes ``LoRA_uns`` and
``FT_uns`` edits (``weights_copy = {}``; ``apply_ft_uns_to_model`` returns no deltas unless
``return_orig_weights``), so over several records those two would be continual editing while HPSE
is restored. The script's ``.cuda()`` and ``.to('cuda')`` calls are sent to the CPU. Without the
MiniLM model in the local Hugging Face cache its similarity score is reported as n/a (NaN
embeddings); the BLEU and ROUGE scores are EasyEdit's.

    EASYEDIT_SRC=/path/to/EasyEdit HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 \
        python docs/easyedit-uns/run_table.py --records 3 --out docs/easyedit-uns/unke-3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

import hpse_easyedit.easyedit  # noqa: F401  (imports EasyEdit from $EASYEDIT_SRC)
from hpse_easyedit import HPSEHyperParams, load_model
from hpse_easyedit.data_files import UNKE_FILE, UNKE_SUBJECTS_FILE, data_dir
from hpse_easyedit.integrations.unstructured import apply_hpse_uns_to_model, attach_subjects

logger = logging.getLogger("run_table")
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def load_script():
    path = Path(os.environ["EASYEDIT_SRC"]) / "examples" / "run_AKEW_both.py"
    spec = importlib.util.spec_from_file_location("run_AKEW_both", path)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    spec.loader.exec_module(module)
    sys.path[:] = saved
    return module


def cuda_to_cpu() -> None:
    to = torch.Tensor.to
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.to = lambda self, *a, **k: to(self, *("cpu" if x == "cuda" else x for x in a), **k)


def no_edit(model, tok, hparams, batch, **kwargs) -> dict:
    """The unedited reference row: nothing is changed, nothing to restore."""
    return {}


def with_subjects(dataset_class: type, subjects: dict) -> type:
    """The script's dataset class, then the docs' second line ``attach_subjects(ds, subjects)``."""

    class WithSubjects(dataset_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            attach_subjects(self, subjects)

    return WithSubjects


def minilm_or_nan() -> str:
    from easyeditor.evaluate import evaluate_uns
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(MINILM, local_files_only=True)
    except Exception:

        class NaNEncoder:
            def __init__(self, *args, **kwargs):
                pass

            def encode(self, sentences, **kwargs):
                return torch.full((len(sentences), 4), float("nan"))

        evaluate_uns.SentenceTransformer = NaNEncoder
        logger.warning("%s is not in the local Hugging Face cache: its score is n/a", MINILM)
        return MINILM


def write_table(out: Path) -> None:
    """``table.md``: EasyEdit's scores per method (percent), the answers that came back empty, and
    the seconds per record (model load, edit and the script's generation)."""
    summary = json.loads((out / "summary.json").read_text())
    head = (
        "| method | Original BLEU | Original R-1 | Original R-L | Para BLEU | Para R-1 "
        "| Para R-L | Sub R-1 | Sub R-L | MiniLM | empty answers | s / record |"
    )
    lines = [head, "|" + "---|" * 12]
    for method, row in summary.items():
        m = row["metrics"]
        items = json.loads((out / f"{method}_results.json").read_text())
        answers = [
            a
            for i in items
            for a in [i["original_prediction"], i["para_prediction"], *i["sub_pred"]]
        ]
        empty = sum(not a.strip() for a in answers)
        bert = m["Original"].get("Bert Score")
        cells = [
            100 * m[p][k]
            for p, k in (
                ("Original", "BLEU SCORE"),
                ("Original", "ROUGE-1"),
                ("Original", "ROUGE-L"),
                ("Para", "BLEU SCORE"),
                ("Para", "ROUGE-1"),
                ("Para", "ROUGE-L"),
                ("Sub", "ROUGE-1"),
                ("Sub", "ROUGE-L"),
            )
        ]
        seconds = sum(row["seconds_per_record"]) / len(row["seconds_per_record"])
        lines.append(
            f"| {method} | "
            + " | ".join(f"{c:.1f}" for c in cells)
            + f" | {'n/a' if bert is None or math.isnan(bert) else f'{bert:.3f}'}"
            + f" | {empty} of {len(answers)} | {seconds:.0f} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    logger.info("wrote %s", out / "table.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3, help="first N UnKEBench records")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["HPSE", "LoRA_uns", "FT_uns", "Unedited"],
        help="also HPSE_subjects: HPSE with attach_subjects (Introduce {subject}.)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "unke-3")
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="only write table.md from the summary.json and results in --out",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.table_only:
        write_table(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)

    model, _ = load_model(HPSEHyperParams.from_json(REPO / "hparams/HPSE/smollm2-135m.json"))
    local_dir = model.name_or_path  # the converted embedded model; the script loads model_name
    del model
    hparams_files = {
        "HPSE": json.loads((REPO / "hparams" / "HPSE" / "smollm2-135m.json").read_text()),
        "HPSE_subjects": json.loads((REPO / "hparams" / "HPSE" / "smollm2-135m.json").read_text()),
        "Unedited": json.loads((REPO / "hparams" / "HPSE" / "smollm2-135m.json").read_text()),
        "LoRA_uns": json.loads((HERE / "LoRA_uns-smollm2-135m.json").read_text()),
        "FT_uns": json.loads((HERE / "FT_uns-smollm2-135m.json").read_text()),
    }
    script = load_script()
    cuda_to_cpu()
    script.UNSTRUCTURED_ALG_DICT["HPSE"] = (HPSEHyperParams, apply_hpse_uns_to_model)  # the line
    script.UNSTRUCTURED_ALG_DICT["Unedited"] = (HPSEHyperParams, no_edit)
    script.UNSTRUCTURED_ALG_DICT["HPSE_subjects"] = (HPSEHyperParams, apply_hpse_uns_to_model)
    plain_dataset = script.AKEWUnifiedDataset
    subjects = json.loads((data_dir() / UNKE_SUBJECTS_FILE).read_text())
    encoder = minilm_or_nan()
    records = json.loads((data_dir() / UNKE_FILE).read_text())[: args.records]

    from easyeditor.evaluate.evaluate_uns import eval_akew_unstructured

    summary_path = args.out / "summary.json"  # methods of an earlier run into --out are kept
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    scratch = Path(tempfile.mkdtemp(prefix="easyedit-uns-"))  # one-record data dirs: not committed
    for method in args.methods:
        script.AKEWUnifiedDataset = (
            with_subjects(plain_dataset, subjects) if method == "HPSE_subjects" else plain_dataset
        )
        hp_path = args.out / f"{method}.hparams.json"
        hp_path.write_text(json.dumps({**hparams_files[method], "model_name": local_dir}, indent=2))
        edited, seconds = [], []
        for k, record in enumerate(records):
            one = scratch / f"record-{k}"
            (one / "UnKE").mkdir(parents=True, exist_ok=True)
            (one / "UnKE" / "final_data_v3.json").write_text(json.dumps([record]))
            (one / "alpaca_data.json").write_text(
                json.dumps(
                    [
                        {"instruction": f"Count to {i}.", "input": "", "output": str(i)}
                        for i in range(20)
                    ]
                )
            )
            run = argparse.Namespace(
                editing_method=method,
                hparams_dir=str(hp_path),
                data_type="unke",
                data_dir=str(one),
                ds_size=None,
                sequential_edit=False,
                batch_size=1,
            )
            start = time.perf_counter()
            data, _ = script.run_unstructured_editing(run)
            seconds.append(time.perf_counter() - start)
            edited.extend(dict(item, id=k) for item in data)
            logger.info("%s record %d: %.0f s", method, k, seconds[-1])
        result_path = args.out / f"{method}_results.json"
        result_path.write_text(json.dumps(edited, indent=2))
        metrics = eval_akew_unstructured(str(result_path), "unke", encoder, "cpu")
        summary[method] = {"metrics": metrics, "seconds_per_record": seconds}
        summary_path.write_text(json.dumps(summary, indent=2, default=str))
    shutil.rmtree(scratch)
    write_table(args.out)


if __name__ == "__main__":
    main()
