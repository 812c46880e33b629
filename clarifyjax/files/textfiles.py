"""The text files a user hands to `clarifyjax` and the files it writes back, checked up front: a bad
file fails with one line naming it (and the line in it) before any model loads.

`read_text_file` (UTF-8, byte-order mark dropped), `split_lines`, `check_output` (an output that
may be written), `atomic_write_bytes`; `check_texts` is the one check of texts handed to a model,
and `text_problem` the one rule for a text a user gives, whichever way it arrives."""
from __future__ import annotations

import codecs
import os
import stat
import tempfile
import unicodedata
from pathlib import Path
from collections.abc import Sequence

# Checked longest first: a UTF-32-LE mark starts with the UTF-16-LE one.
_FOREIGN_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                 (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
# Suffixes read as tables (header row); any other file holds one text per line.
TABLE_SUFFIXES = (".tsv", ".csv", ".jsonl")


def read_text_file(path: str | os.PathLike, *, error: type[Exception] = ValueError) -> str:
    """The text of a UTF-8 file (byte-order mark dropped), or `error` naming the file (and line).

    The mark (Excel's "CSV UTF-8" writes one) must never end up in the first header or situation.
    Another encoding is an error naming the line of the first bad byte (a UTF-16 / UTF-32 mark is
    named as such); a NUL is an error naming its line (a binary file, or UTF-16 without a mark).

    Pipes are read too (``--situations <(head -100 all.txt)``); directories and devices are not.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        raise error(f"{path}: cannot read it ({e.strerror})") from e
    if stat.S_ISDIR(mode):
        raise error(f"{path}: is a directory, not a file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise error(f"{path}: not a regular file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read it ({e.strerror})") from e
    return decode_utf8(data, str(path), error=error)


def decode_utf8(data: bytes, name: str, *, error: type[Exception] = ValueError) -> str:
    """`data` as UTF-8 (an optional byte-order mark dropped); `error` names `name` and the line."""
    for bom, encoding in _FOREIGN_BOMS:
        if data.startswith(bom):
            raise error(f"{name}: {encoding} text (byte-order mark {bom.hex()}); save it as UTF-8")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, line_start = data.count(b"\n", 0, e.start) + 1, data.rfind(b"\n", 0, e.start) + 1
        raise error(f"{name}:{line}: not UTF-8 text (byte "
                    f"0x{data[e.start]:02x} at column {e.start - line_start + 1}); save it as "
                    "UTF-8") from None
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise error(f"{name}:{line}: holds a NUL character (a binary "
                    "file, or UTF-16 text without a byte-order mark?)")
    return text


def split_lines(text: str) -> list[str]:
    """Lines split on "\\n" (a trailing "\\r" dropped), as editors and `wc -l` count them.
    Not `str.splitlines`: it also splits on form feeds and U+2028, which would shift every later
    situation against its question."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def is_blank(text: str) -> bool:
    """Only whitespace and invisible characters (format: zero-width space, BOM; control)."""
    return all(c.isspace() or unicodedata.category(c) in ("Cf", "Cc") for c in text)


def text_problem(value) -> str | None:
    """What makes `value` unusable as a text a user typed for the models (a situation, an answer,
    a paraphrase), or None: not a string (a JSON number stays a number), empty or only
    whitespace and invisible characters (zero-width spaces), or a NUL character or lone
    surrogate that no tokenizer encodes. The one rule of `ask`, `interact`, `web` and SaGE's
    questions; each caller puts its own name in front ("field 'situation' is empty")."""
    if not isinstance(value, str):
        if isinstance(value, (bool, int, float)):
            kind = "true/false" if isinstance(value, bool) else "a number"
            return f"must be text, got {kind} ({value!r}); quote it to use it as text"
        kind = {type(None): "null", list: "a list", dict: "an object"}.get(type(value))
        return f"must be text, got {kind or type(value).__name__}"
    if is_blank(value):
        return "is empty" if not value.strip() else (
            f"is empty: it holds only invisible characters ({_codepoints(value.strip())})")
    nul = value.find("\x00")
    if nul >= 0:
        return f"holds a NUL character (at character {nul + 1}), which is not text"
    at = unencodable(value)
    if at is not None:
        return (f"holds {value[at]!r} at character {at + 1} (a lone surrogate: bytes that were "
                "not UTF-8), which is not encodable text")
    return None


def _codepoints(text: str, limit: int = 3) -> str:
    names = list(dict.fromkeys(f"U+{ord(c):04X}" for c in text if not c.isspace()))
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def unencodable(text: str) -> int | None:
    """Index of the first character of `text` that has no UTF-8 encoding (a lone surrogate, as
    JSON's "\\ud800" or Python's surrogateescape make), or None when the text is fine."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def check_texts(texts, name: str = "texts") -> list[str]:
    """`texts` as a list of str. A bare string (TypeError), a non-string item (TypeError naming
    `name[i]`) or a string that cannot be encoded (ValueError naming `name[i]` and the character:
    a lone surrogate, on which a tokenizer library would fail) is a clear error."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of strings, got a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] is {type(t).__name__}, expected str: {t!r}")
        at = unencodable(t)
        if at is not None:
            raise ValueError(f"{name}[{i}] holds {t[at]!r} at character {at} (a lone surrogate), "
                             f"which is not encodable text: {t[:60]!r}")
    return texts


def check_output_folder(out: str | os.PathLike, *, option: str = "--out",
                        error: type[Exception] = ValueError) -> Path:
    """Check, before any work, that `out` can be (or already is) a folder to write into: not a
    file, a device or /dev/null, and under a folder that exists as a folder and can be written
    (probed). `error` names `option` and the path."""
    if not str(out).strip():  # before Path(), which reads "" as "."
        raise error(f"{option}: empty; give a folder")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise error(f"{option} {out}: " + ("is a file" if out.is_file() else "is not a folder "
                                            "(a device?)") + "; give a folder")
    folder = out.absolute()
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise error(f"{option} {out}: {folder} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise error(f"{option} {out}: cannot write in {folder} ({e.strerror})") from e
    return out


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file 0600; give it the permissions of an ordinary new file.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def describe_os_error(e: OSError) -> str:
    """"PATH: reason" for an OSError (its paths first), rather than Python's "[Errno 13] ..."."""
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    reason = e.strerror or str(e)
    return f"{paths}: {reason}" if paths else reason


def check_output(out: str | os.PathLike, *, overwrite: bool, option: str = "--out",
                 inputs: Sequence[tuple[str, str | os.PathLike]] = (),
                 error: type[Exception] = ValueError) -> Path:
    """Check, before any work, that `out` can receive a new file; `error` names the path.

    Refused: a directory or a non-regular file; an existing non-empty file unless `overwrite`
    (it holds an earlier run's results); the same file as one of `inputs` ((option, path) pairs);
    a folder that cannot be made or written (probed by creating a file, so that read-only mounts
    and permissions are caught whoever runs it).
    """
    out = Path(out)
    if out.is_dir():
        raise error(f"{option} {out}: is a directory; give a file name")
    if out.exists():
        if not out.is_file():
            raise error(f"{option} {out}: not a regular file")
        if out.stat().st_size > 0 and not overwrite:
            raise error(f"{option} {out}: already exists (an earlier run's results?); pass "
                        "--overwrite to replace it, or choose another file")
        for name, path in inputs:
            if Path(path).exists() and os.path.samefile(out, path):
                raise error(f"{option} {out}: is the {name} file; the results would replace it")
    folder = out.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise error(f"{option} {out}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise error(f"{option} {out}: cannot write in {folder} ({e.strerror})") from e
    return out
