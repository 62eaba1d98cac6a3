"""One self-contained HTML file for one or more benchmark runs: tables, the step-in plot, every case.

``python -m benchmarks.report RUN [RUN ...] --html FILE`` writes it (``benchmarks/report/__main__.py``).
The file needs no network: styles, the filter script and the plot (a base64 PNG) are inline. It holds

- the paper-layout table (``report.paper_cells``) and the case-by-case comparison of
  ``benchmarks.paired`` (means with 95% bootstrap intervals; every run against the first: paired
  differences with their intervals, wins / ties / losses);
- the mean step-in rate per round (``report.plot_stepin_rates``);
- every case: its passages, questions, expected answers with aliases, each run's answer side by side
  with the matched answer marked and the official verdict (MQuAKE-uns: the substring check per
  question and the record's Ind / Cmp; UnKEBench: the judge's facts and verdicts, Dmp per
  sub-question), and, for runs that stored them (``benchmarks.rollouts``), each round's rollout per
  request with the tokens the teacher wrote highlighted and the gate's numbers on hover;
- filters: all cases, cases where the runs disagree, wins or losses of run B against run A (on the
  per-case Avg, as ``benchmarks.paired`` counts them).

Rollout text is decoded with the tokenizer of the run's ``hparams.model_name`` (the embedded SmolLM2
works offline); without a tokenizer the token ids are shown.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hpse_easyedit.atomic import replacing

from ..metrics import answer_matches
from ..paired import ANSWER_DIVERSITY, METRICS, load_run, multi_report, paired_report
from . import judge_note, paper_cells, plot_stepin_rates
from ..rollouts import unpack_gaps, unpack_rollout
from ..tasks import TASKS, Question

__all__ = ["RunData", "load_tokenizer", "read_run", "write_html_report"]

log = logging.getLogger(__name__)

Decoder = Callable[[Sequence[int]], str]


@dataclass
class RunData:
    """One run directory: its label, config, summary (None if not written yet) and ``{case_id: record}``."""

    path: Path
    label: str
    benchmark: str
    config: dict
    summary: dict | None
    records: dict[str, dict]
    decode: Decoder | None = field(default=None, repr=False)

    @property
    def hparams(self) -> dict:
        return self.config.get("hparams") or {}


def read_run(path: str | os.PathLike, label: str | None = None) -> RunData:
    """A run directory as ``RunData``; the label defaults to the run's own ``--label``, else its directory name."""
    path = Path(path)
    benchmark, records = load_run(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    summary_file = path / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else None
    label = label or (summary or {}).get("label") or path.name
    return RunData(path, label, benchmark, config, summary, records)


def load_tokenizer(model_name: str) -> Decoder | None:
    """A decoder for ``model_name``'s token ids (local directory, HF cache, or the embedded SmolLM2), or None.

    Never runs remote code; a tokenizer that cannot be had offline gives None and the report shows ids.
    """
    try:
        from transformers import AutoTokenizer

        from hpse_easyedit.loading import model_source  # the loader's own lookup, embedded-model fallback included

        source = model_source(model_name)
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - any failure means "no tokenizer": the report shows ids
        log.warning("no tokenizer for %s (%s); rollouts are shown as token ids", model_name, str(err).splitlines()[0][:200])
        return None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


# ---------------------------------------------------------------------------------------------- html pieces
def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _ci(mean_value: float, ci: Sequence[float]) -> str:
    return f"{mean_value:.1f} <small>[{ci[0]:.1f}, {ci[1]:.1f}]</small>"


def _paper_table_html(runs: Sequence[RunData]) -> str:
    rows = [(r.label, {r.benchmark: r.summary or _summary_from_records(r)}) for r in runs]
    groups, names, body = paper_cells(rows)
    head = ""
    if len(groups) > 1:
        head = "<tr><th></th>" + "".join(f'<th colspan="{n}">{_e(t)}</th>' for t, n in groups) + "</tr>"
    head += "<tr>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>"
    rows_html = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>" for cells in body)
    note = judge_note([r.summary or _summary_from_records(r) for r in runs]).strip()
    return (f'<table class="num"><thead>{head}</thead><tbody>{rows_html}</tbody></table>'
            + (f'<p class="note">{_e(note)}</p>' if note else ""))


def _summary_from_records(run: RunData) -> dict:
    """The task's summary of the records there are (a run whose summary.json is not written yet)."""
    return TASKS[run.benchmark].partial_summary(list(run.records.values()))


def _comparison_html(runs: Sequence[RunData], resamples: int) -> tuple[str, dict[str, list[float | None]], int]:
    """Means with intervals, paired differences against the first run; also the step-in series and n cases."""
    loaded = [(r.benchmark, r.records) for r in runs]
    if len(runs) == 1:
        rep = paired_report(runs[0].path, runs[0].path, resamples=resamples, runs=(loaded[0], loaded[0]))
        pairs, n = [rep], rep["n_cases"]
    else:
        multi = multi_report([r.path for r in runs], resamples=resamples, loaded=loaded)
        pairs, n = multi["pairs"], multi["n_cases"]
    metrics = [m for m in pairs[0]["metrics"] if all(m in p["metrics"] for p in pairs)]
    series = {runs[0].label: pairs[0]["stepin_rate_by_round"]["a"]}
    lines = ["<tr><th>run</th>" + "".join(f"<th>{_e(m)}</th>" for m in metrics)
             + (f"<th>Avg &minus; {_e(runs[0].label)}</th><th>wins / ties / losses</th>" if len(runs) > 1 else "") + "</tr>"]
    lines.append(f"<tr><td>{_e(runs[0].label)}</td>"
                 + "".join(f"<td>{_ci(pairs[0]['metrics'][m]['a'], pairs[0]['metrics'][m]['a_ci95'])}</td>" for m in metrics)
                 + ("<td></td><td></td>" if len(runs) > 1 else "") + "</tr>")
    diffs = []
    for run, p in zip(runs[1:], pairs if len(runs) > 1 else []):
        series[run.label] = p["stepin_rate_by_round"]["b"]
        avg = p["metrics"]["Avg"]
        lines.append(f"<tr><td>{_e(run.label)}</td>"
                     + "".join(f"<td>{_ci(p['metrics'][m]['b'], p['metrics'][m]['b_ci95'])}</td>" for m in metrics)
                     + f"<td>{avg['diff']:+.1f} <small>[{avg['diff_ci95'][0]:+.1f}, {avg['diff_ci95'][1]:+.1f}]</small></td>"
                     + f"<td>{avg['b_wins']} / {avg['ties']} / {avg['b_losses']}</td></tr>")
        rows = "".join(
            f"<tr><td>{_e(m)}</td><td>{r['diff']:+.1f} <small>[{r['diff_ci95'][0]:+.1f}, {r['diff_ci95'][1]:+.1f}]</small></td>"
            f"<td>{r['b_wins']} / {r['ties']} / {r['b_losses']}</td></tr>"
            for m, r in p["metrics"].items())
        diffs.append(f"<details><summary>{_e(run.label)} &minus; {_e(runs[0].label)}, every metric</summary>"
                     f'<table class="num"><tr><th>metric</th><th>difference (95% CI)</th><th>wins / ties / losses</th></tr>'
                     f"{rows}</table></details>")
    finished_by = "the run" if len(runs) == 1 else ("both runs" if len(runs) == 2 else f"all {len(runs)} runs")
    caption = (f"{n} case(s) finished by {finished_by}; means in percent with 95% bootstrap intervals "
               f"({resamples} resamples of the cases)" + ("; differences are paired, case by case, against "
                                                         f"{_e(runs[0].label)}" if len(runs) > 1 else ""))
    table = f'<p class="note">{caption}</p><table class="num">{"".join(lines)}</table>' + "".join(diffs)
    if ANSWER_DIVERSITY in metrics:
        table += (f'<p class="note">{ANSWER_DIVERSITY} is a diagnostic, not a paper metric: 1 - SelfBLEU-4 among all '
                  "answers of a case (near 0 when every question is answered by reciting the same passage).</p>")
    return table, series, n


def _plot_html(series: Mapping[str, Sequence[float | None]], benchmark: str, n: int) -> str:
    buf = io.BytesIO()
    plot_stepin_rates(series, buf, title=f"Step-in rate per round, {benchmark}, {n} cases")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="step-in rate per round" src="data:image/png;base64,{data}">'


def _mark_match(answer: str, aliases: Sequence[str]) -> tuple[str, bool]:
    """The answer as HTML with the first matching alias marked, and the official verdict."""
    ok = answer_matches(answer, aliases)
    low = answer.lower()
    if ok and len(low) == len(answer):
        for alias in aliases:
            at = low.find(alias.lower()) if alias else -1
            if at >= 0:
                end = at + len(alias)
                return f"{_e(answer[:at])}<mark>{_e(answer[at:end])}</mark>{_e(answer[end:])}", ok
    return _e(answer), ok


def _verdict(ok: bool | None, text: str = "") -> str:
    if ok is None:
        return '<span class="v na">no verdict</span>'
    return f'<span class="v {"ok" if ok else "no"}">{"&#10003;" if ok else "&#10007;"}{(" " + _e(text)) if text else ""}</span>'


def _facts_html(fs: Mapping[str, Any] | None) -> str:
    if not fs:
        return ""
    items = "".join(f"<li>{_verdict(bool(ok))} {_e(f)}</li>" for f, ok in zip(fs.get("facts") or [], fs.get("supported") or []))
    score = fs.get("score")
    head = f"Jnt (FActScore) {100 * score:.0f}" if isinstance(score, (int, float)) else "Jnt"
    partial = (' <span class="v na">judge answer incomplete: facts without a verdict count as unsupported</span>'
               if fs.get("complete") is False else "")
    return (f'<details class="facts"><summary>{head}: {len(fs.get("facts") or [])} fact(s){partial}</summary>'
            f"<ul>{items}</ul></details>")


def _answer_cell(q: Question, rec: Mapping[str, Any] | None) -> str:
    """One run's answer to ``q`` with its verdict: the alias found (``alias``), the judge's verdict
    (``coverage``) or the judge's facts (``facts``)."""
    if rec is None:
        return '<td class="missing">not run</td>'
    answer = q.answer(rec)
    if q.check == "facts":
        fs = (rec.get("factscore") or [None, None])[q.facts] if len(rec.get("factscore") or []) > q.facts else None
        return f"<td>{_e(answer)}{_facts_html(fs)}</td>"
    if q.check == "coverage":
        dmp = rec.get("dmp_scores") or []
        ok = bool(dmp[q.index]) if q.index < len(dmp) and dmp[q.index] is not None else None
        return f"<td>{_verdict(ok)} {_e(answer)}</td>"
    text, ok = _mark_match(answer, q.expected)
    return f"<td>{_verdict(ok)} {text}</td>"


def _qa_rows(questions: Sequence[Question], recs: Sequence[dict | None]) -> list[str]:
    """One table row per question of a case (``Task.case_questions``): the question, the expected answer
    (with its aliases; the passage for a question judged against it) and every run's answer."""
    rows = []
    for q in questions:
        gold = q.expected
        expected = ("<small>the passage</small>" if gold is None else f"<b>{_e(gold[0])}</b>"
                    + (f'<br><small>also: {_e(", ".join(gold[1:]))}</small>' if len(gold) > 1 else ""))
        cells = "".join(_answer_cell(q, rec) for rec in recs)
        rows.append(f"<tr><td><small>{q.kind}</small><br>{_e(q.text)}</td><td>{expected}</td>{cells}</tr>")
    return rows


def rollout_html(stored: Mapping[str, Any], decode: Decoder | None, attrs: str) -> str:
    """One stored rollout as a block of text, each stepped-in token in ``<mark data-t=INDEX data-p=P data-g=G>``.

    ``P`` is the teacher's probability of the token in percent (``pi*(y*)``, what the gate compares with
    kappa), ``G`` the gate's margin ``log pi*(y*) - log pi_theta(y*)`` in nats (what it compares with tau;
    runs stored before the margin was kept have none); the page's script turns it, with the block's tau and kappa, into the hover text, so the
    file carries a few bytes per step-in instead of a sentence. Runs of student tokens are decoded
    together (multi-byte characters split over tokens survive); each stepped-in token is decoded
    alone. Without ``decode`` the ids are shown.
    """
    ids, mask, probs = unpack_rollout(stored)
    gaps = unpack_gaps(stored)
    show: Decoder = decode or (lambda seg: "".join(f"\u27e8{t}\u27e9" for t in seg))
    parts, start = [], 0
    for t, stepped in enumerate(mask + [True]):
        if not stepped:
            continue
        if start < t:
            parts.append(_e(show(ids[start:t])))
        if t < len(ids):
            p = f' data-p="{100 * probs[t]:.0f}"' if probs else ""
            p += f' data-g="{gaps[t]:g}"' if gaps else ""
            parts.append(f'<mark data-t="{t}"{p}>{_e(show(ids[t:t + 1]))}</mark>')
        start = t + 1
    n_in = sum(mask)
    return (f'<div class="ro" {attrs} data-n="{len(ids)}" data-stepins="{n_in}">'
            f'<div class="ro-head">{len(ids)} tokens, {n_in} stepped in ({100 * n_in / max(len(ids), 1):.1f}%)</div>'
            f'<div class="ro-text">{"".join(parts)}</div></div>')


def _rollouts_html(run_index: int, run: RunData, rec: Mapping[str, Any]) -> str:
    rounds = rec.get("rollouts")
    if not rounds:
        return ""
    subjects = rec.get("subjects") or []
    out, previous = [], None
    for r, requests in enumerate(rounds, 1):
        if requests is None:
            out.append(f"<h5>round {r}: no rollout</h5>")
        elif previous is not None and requests == rounds[previous - 1]:
            out.append(f"<h5>round {r}: the same rollout{'s' if len(requests) > 1 else ''} as round {previous}</h5>")
        else:
            previous = r
            out.append(f"<h5>round {r}</h5>")
            for k, stored in enumerate(requests):
                subject = subjects[k] if k < len(subjects) else f"request {k + 1}"
                out.append(f'<div class="req">Introduce <b>{_e(subject)}</b>.</div>'
                           + rollout_html(stored, run.decode, f'data-run="{run_index}" data-round="{r}" data-req="{k}"'))
    hp = run.hparams
    return (f'<details class="rollouts" data-tau="{_e(hp.get("tau"))}" data-kappa="{_e(hp.get("kappa"))}"><summary>'
            f"{_e(run.label)}: rollouts, the teacher's tokens highlighted (hover for the gate)</summary>{''.join(out)}</details>")


def _case_values(run: RunData, rec: Mapping[str, Any]) -> list[float]:
    return [float(rec[m]) for m in METRICS[run.benchmark]]


def _case_html(cid: str, case: Mapping[str, Any] | None, runs: Sequence[RunData]) -> str:
    recs = [r.records.get(cid) for r in runs]
    values = [None if rec is None else _case_values(run, rec) for run, rec in zip(runs, recs)]
    avgs = ["" if v is None else f"{sum(v) / len(v):.6f}" for v in values]
    present = [tuple(round(x, 9) for x in v) for v in values if v is not None]
    disagree = int(len(set(present)) > 1)
    metrics = METRICS[runs[0].benchmark]
    chips = "".join(
        f'<span class="chip">{_e(run.label)}: ' + ("not run" if v is None else
                                                   " ".join(f"{m} {100 * x:.0f}" for m, x in zip(metrics, v))
                                                   + f" &middot; Avg {100 * sum(v) / len(v):.0f}"
                                                   + (" &middot; judge incomplete" if rec.get("judge_complete") is False else ""))
        + "</span>"
        for run, v, rec in zip(runs, values, recs))
    subjects = next((rec.get("subjects") for rec in recs if rec and rec.get("subjects")), None) or (
        [r["subject"] for r in case["requests"]] if case else [])
    head = (f'<summary><b>case {_e(cid)}</b> &middot; {_e(", ".join(subjects))}'
            f'{" &middot; <i>runs disagree</i>" if disagree else ""}<br>{chips}</summary>')
    body = []
    if case is not None:
        passages = "".join(f"<p><b>{_e(r['subject'])}</b>: {_e(r['target_new'])}</p>" for r in case["requests"])
        body.append(f'<details class="passages"><summary>edited passage(s)</summary>{passages}</details>')
        rows = _qa_rows(TASKS[runs[0].benchmark].case_questions(case), recs)
        header = "<tr><th>question</th><th>expected</th>" + "".join(f"<th>{_e(r.label)}</th>" for r in runs) + "</tr>"
        body.append(f'<table class="qa">{header}{"".join(rows)}</table>')
    else:
        body.append('<p class="note">the runs&#x27; data file was not found (--data, --data-file), so questions are '
                    "not shown; the answers:</p>")
        body += [f"<p><b>{_e(run.label)}</b>: {_e(json.dumps(rec.get('answers'), ensure_ascii=False))}</p>"
                 for run, rec in zip(runs, recs) if rec]
    body += [_rollouts_html(i, run, rec) for i, (run, rec) in enumerate(zip(runs, recs)) if rec]
    return (f'<details class="case" id="case-{_e(cid)}" data-case="{_e(cid)}" data-avg="{",".join(avgs)}" '
            f'data-disagree="{disagree}">{head}{"".join(body)}</details>')


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1400px;padding:0 18px 40px;color:#1d2430}
h1{font-size:22px;margin:18px 0 4px} h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:3px}
h5{margin:10px 0 3px;font-size:13px;color:#445}
table{border-collapse:collapse;margin:6px 0} td,th{border:1px solid #d5dae3;padding:4px 7px;vertical-align:top;text-align:left}
th{background:#f1f4f8} table.num td:not(:first-child){text-align:right;white-space:nowrap} small{color:#667}
.note{color:#556;font-size:13px;margin:4px 0} .plot{max-width:520px;border:1px solid #e3e6ec}
.runs td{font-size:13px} .chip{display:inline-block;background:#eef1f6;border-radius:9px;padding:0 8px;margin:3px 6px 0 0;font-size:12px}
details.case{border:1px solid #d5dae3;border-radius:6px;margin:8px 0;padding:6px 10px;background:#fff}
details.case>summary{cursor:pointer} details.case[open]>summary{margin-bottom:8px}
table.qa{width:100%;table-layout:fixed;font-size:13px} table.qa td{word-wrap:break-word}
table.qa th:first-child{width:20%} table.qa th:nth-child(2){width:11%}
mark{background:#c6f0c2;border-radius:2px;padding:0 1px} .ro mark{background:#ffb347;cursor:help;box-shadow:inset -1px 0 0 rgba(0,0,0,.28)}
.v{font-weight:bold;margin-right:3px} .v.ok{color:#18803c} .v.no{color:#c0392b} .v.na{color:#888;font-weight:normal}
.missing{color:#999;font-style:italic} .req{margin-top:4px;font-size:12px;color:#445}
.ro{border-left:3px solid #e6dccb;padding:2px 8px;margin:2px 0 6px;background:#fffaf3}
.ro-head{font-size:11px;color:#777} .ro-text{white-space:pre-wrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.filters{position:sticky;top:0;background:#f8f9fb;border:1px solid #dde2ea;border-radius:6px;padding:6px 10px;z-index:2}
.filters label{margin-right:12px} .hidden{display:none}
ul{margin:3px 0 3px 18px;padding:0} li{margin:1px 0} .passages p{margin:4px 0;font-size:13px}
"""

_JS = """
(function(){
  var cases=[].slice.call(document.querySelectorAll('details.case'));
  var count=document.getElementById('shown');
  function apply(){
    var mode=document.querySelector('input[name=f]:checked').value;
    var a=+document.getElementById('runA').value, b=+document.getElementById('runB').value, n=0;
    cases.forEach(function(el){
      var avg=el.dataset.avg.split(','), show=true;
      if(mode==='disagree'){show=el.dataset.disagree==='1';}
      else if(mode==='wins'||mode==='losses'){
        if(avg[a]===''||avg[b]===''){show=false;}
        else{var d=parseFloat(avg[b])-parseFloat(avg[a]); show=mode==='wins'?d>1e-9:d<-1e-9;}
      }
      el.classList.toggle('hidden',!show); if(show){n++;}
    });
    count.textContent=n+' of '+cases.length+' cases shown';
  }
  [].slice.call(document.querySelectorAll('.filters input,.filters select')).forEach(function(el){el.addEventListener('change',apply);});
  document.getElementById('openall').addEventListener('click',function(){cases.forEach(function(el){if(!el.classList.contains('hidden')){el.open=true;}});});
  document.getElementById('closeall').addEventListener('click',function(){cases.forEach(function(el){el.open=false;});});
  apply();
  document.addEventListener('mouseover',function(e){
    var m=e.target; if(m.tagName!=='MARK'||!m.dataset.p||m.title){return;}
    var g=m.closest('details.rollouts').dataset;
    m.title='the teacher wrote this token: pi*(y*) = '+(m.dataset.p/100).toFixed(2)+' > kappa '+g.kappa+
      ', and log pi*(y*) - log pi_theta(y*) = '+(m.dataset.g===undefined?'(not stored)':m.dataset.g)+' > tau '+g.tau;
  });
  var h=decodeURIComponent(location.hash.slice(1));
  if(h.indexOf('filter=')===0){
    var q={}; h.split('&').forEach(function(kv){var p=kv.split('='); q[p[0]]=p[1];});
    var r=document.querySelector('input[name=f][value="'+q.filter+'"]'); if(r){r.checked=true;}
    if(q.a){document.getElementById('runA').value=q.a;} if(q.b){document.getElementById('runB').value=q.b;}
    apply();
  }
  else if(h==='open-all'){[].slice.call(document.querySelectorAll('details')).forEach(function(el){el.open=true;});}
  else if(h){var el=document.getElementById(h); if(el&&el.tagName==='DETAILS'){
    el.open=true; [].slice.call(el.querySelectorAll('details')).forEach(function(d){d.open=true;}); el.scrollIntoView();}}
})();
"""


def _filters_html(runs: Sequence[RunData]) -> str:
    def select(ident: str, chosen: int) -> str:
        opts = "".join(f'<option value="{i}"{" selected" if i == chosen else ""}>{_e(r.label)}</option>'
                       for i, r in enumerate(runs))
        return f'<select id="{ident}">{opts}</select>'

    return ('<div class="filters"><label><input type="radio" name="f" value="all" checked> all</label>'
            '<label><input type="radio" name="f" value="disagree"> runs disagree</label>'
            '<label><input type="radio" name="f" value="wins"> wins of B</label>'
            '<label><input type="radio" name="f" value="losses"> losses of B</label>'
            f'A: {select("runA", 0)} B: {select("runB", min(1, len(runs) - 1))} '
            '<small>(wins / losses: per-case Avg of B vs A)</small> &nbsp; '
            '<button id="openall" type="button">open all</button> <button id="closeall" type="button">close all</button> '
            '<span id="shown" class="note"></span></div>')


def _runs_html(runs: Sequence[RunData]) -> str:
    rows = []
    for r in runs:
        hp = r.hparams
        with_rollouts = sum(bool(rec.get("rollouts")) for rec in r.records.values())
        rows.append(f"<tr><td>{_e(r.label)}</td><td><code>{_e(r.path)}</code></td><td>{_e(r.config.get('editor', ''))}</td>"
                    f"<td>{_e(hp.get('model_name', ''))}</td><td>{len(r.records)}</td>"
                    f"<td>{_e((r.summary or {}).get('judge') or '')}</td><td>{with_rollouts}</td></tr>")
    return ('<table class="runs"><tr><th>label</th><th>directory</th><th>editor</th><th>model</th><th>cases</th>'
            f'<th>judge</th><th>cases with rollouts</th></tr>{"".join(rows)}</table>')


def _load_cases(runs: Sequence[RunData], data_dir: str | os.PathLike | None, data_file: str | None,
                strict: bool) -> dict[str, Mapping[str, Any]] | None:
    """The benchmark's cases by id, from the data file the runs recorded (checked by its sha256).

    None, with a warning, when the file is absent (unless ``strict``: the user named ``--data``) or is
    not the file a run used: its questions would then not be the ones the run answered.
    """
    from ..datasets import DataError, default_data_dir, file_sha256

    task = TASKS[runs[0].benchmark]
    where = Path(data_dir or default_data_dir())
    file = data_file or task.data_file
    path = Path(file) if Path(file).is_absolute() else where / file
    try:
        if not path.is_file():
            raise DataError(f"{path}: no such data file")
        digest = file_sha256(path)
        strangers = [str(r.path) for r in runs if digest not in (r.config.get("data") or {}).values()]
        if strangers:
            raise DataError(f"{path} is not the data file that {', '.join(strangers)} recorded in config.json (its "
                            "sha256 differs); pass --data DIR and --data-file FILE naming the file the runs used")
        cases = task.load_cases(where, file)
    except DataError:
        if strict:
            raise
        log.warning("%s; the report lists the answers without their questions", sys.exc_info()[1])
        return None
    return {str(c["case_id"]): c for c in cases}


def write_html_report(run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *, labels: Sequence[str] | None = None,
                      data_dir: str | os.PathLike | None = None, data_file: str | None = None, resamples: int = 10000,
                      tokenizer: str | None = None, rollouts: bool = True, title: str | None = None) -> Path:
    """Write the report of ``run_dirs`` (the first is the baseline) to ``out``; returns its path.

    ``data_dir`` / ``data_file``: where the runs' data file is (default: the default data directory and
    the benchmark's default file); questions are shown only when its sha256 is the one every run
    recorded. ``tokenizer``: a model name or directory to decode rollouts with, instead of each run's
    ``hparams.model_name``. ``rollouts=False`` leaves the rollouts out (a smaller file).
    """
    labels = list(labels or [])
    runs = [read_run(d, labels[i] if i < len(labels) else None) for i, d in enumerate(run_dirs)]
    seen: dict[str, int] = {}
    for r in runs:  # labels name columns and filter choices: make them unique
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} ({r.path.name})"
    benches = {r.benchmark for r in runs}
    if len(benches) > 1:
        raise ValueError(f"the runs mix benchmarks ({', '.join(sorted(benches))}); one report per benchmark")
    benchmark = runs[0].benchmark
    if not rollouts:
        for r in runs:
            r.records = {c: {k: v for k, v in rec.items() if k != "rollouts"} for c, rec in r.records.items()}
    decoders: dict[str, Decoder | None] = {}
    for r in runs:
        if any(rec.get("rollouts") for rec in r.records.values()):
            name = tokenizer or r.hparams.get("model_name")
            if name and name not in decoders:
                decoders[name] = load_tokenizer(name)
            r.decode = decoders.get(name) if name else None
    cases = _load_cases(runs, data_dir, data_file, strict=data_dir is not None or data_file is not None)
    table, series, n_common = _comparison_html(runs, resamples)
    ids = set().union(*(r.records for r in runs))
    order = [c for c in cases if c in ids] if cases else []
    order += sorted(ids - set(order), key=lambda c: (len(c), c))
    names = " vs ".join(r.label for r in runs) if len(runs) <= 3 else f"{len(runs)} runs against {runs[0].label}"
    title = title or f"{TASKS[benchmark].title}: {names}"
    parts = [
        f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _runs_html(runs),
        "<h2>Paper layout</h2>",
        '<p class="note">each run on all the cases it finished (its summary.json; its records while it runs)</p>',
        _paper_table_html(runs),
        "<h2>Case by case</h2>", table,
        "<h2>Step-in rate per round</h2>", _plot_html(series, benchmark, n_common),
        f"<h2>Cases ({len(order)})</h2>",
        '<p class="note">Green: the expected answer or alias found in the answer (the official MQuAKE check); '
        "&#10003;/&#10007;: the verdict (substring check, or the judge's per fact and per sub-question). "
        "Orange in a rollout: a token the privileged teacher wrote (hover for pi*(y*) and the gates); "
        "a round whose rollouts equal the previous round's is not repeated.</p>",
        _filters_html(runs),
        *(_case_html(c, (cases or {}).get(c), runs) for c in order),
        f"<script>{_JS}</script></body></html>",
    ]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        tmp.write_text("".join(parts), encoding="utf-8")
    return out
