"""A failed CLI command in one line: what failed and why -- for a sample fetch, the dataset's own
exception and the index -- with the whole traceback kept in a file the line names."""
from __future__ import annotations

import inspect
import os
import re
import tempfile
import traceback
from typing import Any

from .core.trace import INDEX_NOTE, dataset_index


def one_line(exc: BaseException) -> str:
    """'ZeroDivisionError: division by zero': an exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}{' ...' if len(lines) > 1 else ''}" if lines else type(exc).__name__


# torch's DataLoader re-raises a worker's exception with the worker's traceback as text
_WORKER_ERROR = re.compile(r"^Caught (\w+) in DataLoader worker process (\d+)\.\nOriginal Traceback")


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from or while handling, outermost first."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def failure(exc: BaseException, dataset: Any) -> str:
    """What failed, in one line: the dataset's own exception and the index its fetch raised at --
    in this process read from its __getitem__ frame; from a DataLoader worker, out of the text of
    the worker's traceback torch sends (the exception's last line, and the index where a traced
    fetch, the doctor's, noted it); any other error, its type and first line."""
    for e in _chain(exc):
        found, index = dataset_index(e, dataset) if dataset is not None else (False, None)
        if found:
            at = f" at index {index!r}" if index is not None else ""
            return f"the dataset raised {type(e).__name__}{at}: {str(e).strip() or '(no message)'}".splitlines()[0]
        m = _WORKER_ERROR.match(str(e))
        if m:
            text = str(e)
            name, worker = m.group(1), m.group(2)
            lines = text.strip().splitlines()
            last = next((line for line in reversed(lines) if re.match(rf"^([\w.]*\.)?{name}(:|$)", line)), name)
            msg = last.split(":", 1)[1].strip() if ":" in last else "(no message)"
            noted = [line[len(INDEX_NOTE):] for line in lines if line.startswith(INDEX_NOTE)]
            source = _source_of(dataset)
            if noted:  # the traced fetch (the doctor's) names the index in the worker
                return f"the dataset raised {name} at index {noted[-1]} in DataLoader worker process {worker}: {msg}"
            who = ("the dataset raised" if source and f'File "{source}"' in text and "in __getitem__" in text
                   else "a DataLoader worker raised")
            return f"{who} {name} in DataLoader worker process {worker} (the worker did not report the index): {msg}"
    return one_line(exc)


def _source_of(dataset: Any) -> str | None:
    try:
        return inspect.getsourcefile(type(dataset))
    except (TypeError, OSError):
        return None


def keep_traceback(exc: BaseException, command: str) -> str:
    """The full traceback, written to a file the error line names (the line stays one line)."""
    fd, path = tempfile.mkstemp(prefix=f"fastcollate-{command}-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(exc, file=f)
    return path
