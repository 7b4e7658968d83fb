"""`model/README.md`: a Hugging Face model card for the exported model, built from the run's files.

YAML front matter (library_name, pipeline_tag, tags) as the Hub reads it, then the task, data,
labels, settings, every scalar metric of results.json, and how to load the model with `pipeline`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nlptrain.durable import write_text
from nlptrain.kinds import from_run_config
from nlptrain.report import processes, train_settings
from nlptrain.scores import scalar_metrics, shown_score

CARD_FILE = "README.md"
SETTINGS = ("epochs", "max_steps", "batch_size", "lr", "scheduler", "warmup_ratio", "weight_decay",
            "max_grad_norm", "grad_accum", "precision", "seed", "metric_for_best")


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def metrics_table(results: dict[str, Any]) -> list[str]:
    splits = [s for s in ("valid", "test") if results.get(s)]
    found = {s: scalar_metrics(results[s]) for s in splits}
    names = list(dict.fromkeys(name for s in splits for name in found[s]))
    if not names:
        return ["No evaluation set: no metrics."]
    title = {"valid": "validation", "test": "test"}
    lines = ["| metric | " + " | ".join(title[s] for s in splits) + " |",
             "| --- |" + " ---: |" * len(splits)]
    for name in names:
        cells = [shown_score(found[s][name]) if name in found[s] else "" for s in splits]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def model_card(run_dir: Path) -> str:
    results = _read(run_dir / "results.json")
    run = _read(run_dir / "config.json")
    task = run.get("task", {})
    model_config = _read(run_dir / "model" / "config.json")
    id2label = model_config.get("id2label", {})
    labels = [id2label[k] for k in sorted(id2label, key=int)]
    name, base = task.get("name", "task"), task.get("model", {}).get("name", "?")
    train = train_settings(run)  # the precision as trained
    versions = run.get("versions", {})

    out = ["---", "library_name: transformers", "pipeline_tag: text-classification", "tags:",
           "- nlptrain", "- text-classification", f"- {name}", "---", "",
           f"# {name}: a text classifier fine-tuned with nlptrain", ""]
    if task.get("description"):
        out += [task["description"], ""]
    layers = task.get("model", {}).get("num_hidden_layers")  # a cut encoder is another model
    out += [f"Fine-tuned from `{base}` ({model_config.get('model_type', '?')}, "
            + (f"its first {layers} encoder layers, " if layers else "")
            + f"max length {task.get('model', {}).get('max_length', '?')} tokens) on the "
            f"`{name}` task, with {processes(run)[1]} process(es); nlptrain "
            f"{versions.get('nlptrain', '?')}, torch {versions.get('torch', '?')}, transformers "
            f"{versions.get('transformers', '?')}.", "", "## Data", "",
            "| split | rows | source |", "| --- | ---: | --- |"]
    for split, info in results.get("data", {}).items():
        out.append(f"| {split} | {info.get('rows', '')} | {info.get('source', '')} |")
    out += ["", "## Labels", "", ", ".join(f"`{i}`: {label}" for i, label in enumerate(labels)),
            "", "## Training settings", "", "| setting | value |", "| --- | --- |"]
    picked = bool(results.get("valid"))  # else no evaluation picked the model: the last is it
    out += [f"| {key} | {train[key]} |" for key in SETTINGS if key in train
            and (picked or key != "metric_for_best")]
    kind = from_run_config(run)
    # The model's own record: a pair column may be named in a file's table, not in [data]'s.
    pairs = model_config.get("nlptrain_text_pair",
                             task.get("data", {}).get("text_pair_column", "") != "")
    rule = [kind.decision_rule[0].upper() + kind.decision_rule[1:] + ".", ""] \
        if kind.decision_rule else []
    out += ["", "## Metrics", "", *metrics_table(results), "", *rule, "## Use", "",
            f"A {kind.name.replace('_', '-')} model" + (" of sentence pairs" if pairs else "") + ".",
            "", "```python", "from transformers import pipeline", "",
            'classify = pipeline("text-classification", model="path/to/this/folder")',
            "# truncation=True: texts are cut at the max_length the model was trained with",
            *_usage(kind, pairs, labels), "```", ""]
    return "\n".join(out)


def _usage(kind: Any, pairs: bool, labels: list[str]) -> list[str]:
    text = '{"text": "first sentence", "text_pair": "second sentence"}' if pairs \
        else '"a text to classify"'
    return kind.usage(text, pairs, labels)  # what the pipeline gives is the kind's


def write_model_card(run_dir: str | Path) -> Path:
    """Write `RUN_DIR/model/README.md` from results.json, config.json and model/config.json."""
    run_dir = Path(run_dir)
    path = run_dir / "model" / CARD_FILE
    write_text(path, model_card(run_dir))
    return path
