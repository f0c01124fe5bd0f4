"""A full disk, told in plain words: "no space left on <path>", wherever the error came from.

Writers deep down report a full disk in their own terms: torch's ``[enforce fail at inline_container.cc:672]
unexpected pos``, DuckDB's ``IO Error: Could not write all bytes``, pyarrow's ``IOError``. The one fact they share is
an ``ENOSPC`` (or ``EDQUOT``) somewhere in the chain of exceptions or in the text. ``is_no_space`` finds it, and
``NoSpaceLeft`` says it with the folder that was being written. It does not free space or retry.
"""

from __future__ import annotations

import errno
import os
import shutil

_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28")


class NoSpaceLeft(OSError):
    """The disk holding ``path`` is full; what was committed before is intact."""

    def __init__(self, path: str | os.PathLike[str], doing: str = "writing"):
        free = _free_bytes(path)
        where = f"{path} ({free:,} bytes free)" if free is not None else str(path)
        super().__init__(
            errno.ENOSPC,
            f"no space left on {where} while {doing}; free some space and resume, nothing committed is lost",
        )
        self.path = str(path)

    def __str__(self) -> str:
        return str(self.strerror)


def is_no_space(error: BaseException | None) -> bool:
    """Whether ``error`` or any exception it was raised from or during is a full disk."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _ERRNOS:
            return True
        if any(text in str(error).lower() for text in _TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


def _free_bytes(path: str | os.PathLike[str]) -> int | None:
    for candidate in (path, os.path.dirname(os.fspath(path))):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None
