"""Human-readable summaries of metrics (terminal and report.md)."""

from __future__ import annotations

from typing import Any


def metrics_text(metrics: dict[str, Any]) -> str:
    """Accuracy, macro-F1, per-class precision/recall/F1 and the confusion matrix as a table."""
    names = list(metrics["per_class"])
    width = max(12, *(len(n) + 2 for n in names))
    lines = [f"rows {metrics['rows']}  accuracy {metrics['accuracy']:.4f}  "
             f"macro-F1 {metrics['macro_f1']:.4f}  loss {metrics['loss']:.4f}", "",
             f"{'class':<{width}}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}"]
    for name, row in metrics["per_class"].items():
        lines.append(f"{name:<{width}}{row['precision']:>10.4f}{row['recall']:>10.4f}"
                     f"{row['f1']:>10.4f}{row['support']:>10d}")
    lines += ["", "confusion matrix (rows: true label, columns: predicted)",
              " " * width + "".join(f"{n[:9]:>10}" for n in names)]
    for name, row in zip(names, metrics["confusion_matrix"], strict=True):
        lines.append(f"{name:<{width}}" + "".join(f"{v:>10d}" for v in row))
    return "\n".join(lines)
