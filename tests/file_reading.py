"""Files written from a test's text, and a task over one, for the reader tests."""

from __future__ import annotations

from nlptrain.config import FileSpec
from nlptrain.data.readers import read_examples


def read(tmp_path, name: str, content: bytes | str, **spec):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return read_examples(FileSpec(path=name, **spec), tmp_path, spec.pop("values", []))


def labelled_task(tmp_path, rows: list[tuple[str, str]], **data):
    from nlptrain.config import TaskConfig

    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in rows))
    task = TaskConfig(name="toy", data_dir=str(tmp_path))
    task.data.train, task.data.test_size = "train.tsv", 0.2
    for key, value in data.items():
        setattr(task.data, key, value)
    return task
