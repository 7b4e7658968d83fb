"""A data file opened as text: checked to be a file, read line by line as strict UTF-8 (a BOM
dropped, CRLF accepted), and what is not text named with its cure: another encoding (UTF-16,
cp1252), a packed file (gzip, an .xlsx workbook), a binary file, CR-only line ends."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from nlptrain.errors import DataError

# Packed files by their first bytes: read as text, they were "byte 0x8b is not UTF-8; iconv ...".
PACKED = {rb"\x1f\x8b": ("gzip-compressed", "unpack it (gunzip -k FILE) and give the file it holds"),
          rb"BZh[1-9]1AY&SY": ("bzip2-compressed", "unpack it (bunzip2 -k FILE) and give the file it holds"),
          rb"\xfd7zXZ\x00": ("xz-compressed", "unpack it (unxz -k FILE) and give the file it holds"),
          rb"\x28\xb5\x2f\xfd": ("zstd-compressed", "unpack it (unzstd FILE) and give the file it holds"),
          rb"PK\x03\x04": ("a zip archive (as an .xlsx workbook is)", "save the sheet as .csv or .tsv, "
                           "or unzip it and give the file it holds")}  # (whole signatures: "BZh" is text)
PACKED_SUFFIXES = {".gz": b"\x1f\x8b", ".bz2": b"BZh91AY&SY", ".xz": b"\xfd7zXZ\x00",
                   ".zst": b"\x28\xb5\x2f\xfd", ".zip": b"PK\x03\x04", ".xlsx": b"PK\x03\x04"}


def packed(path: Path | str, first_bytes: bytes) -> str:
    """The error for a packed file, by its first bytes ('' for another file)."""
    what = next((said for magic, said in PACKED.items() if re.match(magic, first_bytes)), None)
    return f"{path}: {what[0]}, not a text file: {what[1]}" if what else ""


def open_checked(path: Path, what: str, typed: str | None = None) -> Path:
    """`path`, checked to be a file. `typed`: the name as the task gave it, relative to its data
    folder; where it names a file from the working folder instead, the error says so."""
    # predict's input is a path of its own: no task, no --data-dir it could be relative to.
    fix = "check --input" if what == "input" else "check the path or --data-dir"
    if path.is_dir():
        article = "an" if what[:1] in "aeiou" else "a"
        raise DataError(f"{path}: a folder, not {article} {what} file; {fix}")
    if not path.is_file():
        here = Path(typed or path.name)  # where a user who typed that name may have meant
        found = (f"; ./{here} is here, but a task's file names are relative to its data folder: "
                 "give --data-dir . or the file's absolute path"
                 if what != "input" and here.is_file() and here.resolve() != path.resolve() else "")
        raise DataError(f"{path}: {what} file not found; {fix}{found}")
    return path


def decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending); strict UTF-8, BOM dropped, CRLF accepted."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            elif number == 1 and packed(path, raw):
                raise DataError(packed(path, raw))
            elif number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise DataError(f"{path}: UTF-16 (it starts with UTF-16's byte order mark, as "
                                "Excel's 'Unicode Text' writes); convert it to UTF-8, e.g. "
                                "iconv -f utf-16 -t utf-8 IN > OUT")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{path}:{number}: byte {raw[err.start]:#04x} at column {err.start + 1} is not "
                    "UTF-8; convert the file, e.g. iconv -f cp1252 -t utf-8 IN > OUT (a file from "
                    "Windows; -f latin1 for other 8-bit files)") from None
            text = text.rstrip("\r\n")
            if "\0" in text:  # valid UTF-8, but no text holds one: UTF-16 read as bytes does
                raise DataError(f"{path}:{number}: a NUL byte (0x00) at column "
                                f"{text.index(chr(0)) + 1}: a binary file, or UTF-16 without "
                                "its byte order mark? Convert it, e.g. iconv -f utf-16le -t "
                                "utf-8 IN > OUT")
            if "\r" in text:  # a CR alone ends no line here: the whole file would read as one
                raise DataError(f"{path}:{number}: a carriage return (\\r) inside the line: the "
                                "file's line ends are probably CR alone (classic Mac); convert "
                                "them, e.g. tr '\\r' '\\n' < IN > OUT")
            yield number, text
