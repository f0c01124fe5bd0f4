"""The SQL box: run one already-checked query in a child process that can touch neither files nor the app's memory.

The parser in ``sql_guard`` is the first line; this is the second, and it relies on limits the operating system
and DuckDB enforce rather than on reading the query. The parent streams the relations the query names (and an
empty copy of every other readable relation, so catalog queries see the whole schema) into Arrow IPC files; the
child maps them, opens an in-memory DuckDB with ``enable_external_access=false``, ``lock_configuration=true``, a
``memory_limit`` and a thread cap, runs the query and streams at most ``max_bytes`` of Arrow back. The child also
caps its own data segment (``RLIMIT_DATA``), may not write a file (``RLIMIT_FSIZE=0``) and is killed at the time
limit. DuckDB's ``memory_limit`` alone does not bound a query such as ``SELECT repeat('x', 20000000) FROM
range(100)``: its string heaps live outside the buffer manager, and in the app's process it reached 2 GB with a
512 MB limit. In a child the worst case is that child's death.

A child serves one query at a time and is then reused for the next (``_Children``): starting one costs an interpreter
and the import of duckdb and pyarrow, about a second, which every query paid before. Each query gets a fresh
in-memory database, so nothing a query did is left for the next. A child that overran its time is killed, one that
died (its memory limit) is not reused, and each is replaced after ``REUSES`` queries.

This file is also the child's script: it imports only the standard library, duckdb and pyarrow, so that the child
starts without the package (``python -I sql_box.py``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
#: Query memory of the box: DuckDB's memory_limit, and the child's data segment is this plus HEADROOM_BYTES.
MEMORY_LIMIT_BYTES = 1024 * MIB
#: What the interpreter, duckdb and pyarrow need on their own before a query allocates anything.
HEADROOM_BYTES = 768 * MIB
THREADS = 2
#: Arrow bytes of a result, summed over its columns; the row limit alone lets 1000 rows of 20 MB through.
MAX_RESULT_BYTES = 64 * MIB
#: Queries one child answers before it is replaced (its heap only grows), and idle children kept per memory limit.
REUSES = 200
IDLE_CHILDREN = 2


class BoxError(RuntimeError):
    """The query failed in the box: ``kind`` is "error" (DuckDB's message), "bytes", "memory" or "time"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Box:
    """One query's box: ``add`` each relation (written to a temporary Arrow file at once), then ``run``."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="comlrl-sql-")
        self._files: dict[str, str] = {}

    def __enter__(self) -> Box:
        return self

    def __exit__(self, *exc: object) -> None:
        self._folder.cleanup()

    def add(self, name: str, data: Any) -> None:
        """Write ``data`` (an Arrow RecordBatchReader or Table) as relation ``name``."""
        import pyarrow as pa

        path = Path(self._folder.name) / f"{len(self._files)}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, data.schema) as writer:
            for batch in data.to_batches() if isinstance(data, pa.Table) else data:
                writer.write_batch(batch)
        self._files[name] = str(path)

    def run(
        self,
        statement: str,
        *,
        limit: int,
        timeout_s: float | None,
        max_bytes: int = MAX_RESULT_BYTES,
        memory_limit_bytes: int = MEMORY_LIMIT_BYTES,
        threads: int = THREADS,
    ) -> Any:
        """Run ``statement`` in a child over the added relations; a pyarrow Table of at most ``limit + 1`` rows,
        so the caller can tell that the limit cut the result. ``BoxError`` when it fails or passes a limit."""
        import pyarrow as pa

        request = {
            "files": self._files,
            "statement": statement,
            "limit": int(limit),
            "max_bytes": int(max_bytes),
            "memory_limit": int(memory_limit_bytes),
            "threads": int(threads),
        }
        child = _CHILDREN.acquire(int(memory_limit_bytes))
        try:
            header, body = child.ask(request, timeout_s)
        except TimeoutError:
            child.kill()
            raise BoxError("time", f"the query ran longer than {timeout_s} s and was stopped") from None
        except EOFError:
            child.kill()
            raise BoxError(
                "memory", f"the query needed more than {memory_limit_bytes // MIB} MiB and was stopped"
            ) from None
        _CHILDREN.release(child)
        if "kind" in header:
            raise BoxError(str(header["kind"]), str(header["message"]))
        return pa.ipc.open_stream(body).read_all()


class _Child:
    """One box process: a JSON request per line on its stdin, a JSON header line and the Arrow bytes on its stdout."""

    def __init__(self, memory_limit_bytes: int):
        self.memory_limit = memory_limit_bytes
        self.proc = subprocess.Popen(
            [sys.executable, "-I", __file__, str(memory_limit_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # a child reports through stdout only: a full stderr pipe would block it
            env={"PATH": os.environ.get("PATH", "")},
        )
        self.answered = 0

    def ask(self, request: dict[str, Any], timeout_s: float | None) -> tuple[dict[str, Any], bytes]:
        """Send one request; the header and body of its answer. TimeoutError past ``timeout_s``, EOFError when the
        child died (killed by the operating system at its memory limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self.proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        header = json.loads(self._read_line(deadline))
        body = self._read_exactly(int(header.get("bytes", 0)), deadline)
        self.answered += 1
        return header, body

    def _read(self, size: int, deadline: float | None) -> bytes:
        fd = self.proc.stdout.fileno()
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], wait)[0]:
            raise TimeoutError
        chunk = os.read(fd, size)
        if not chunk:
            raise EOFError
        return chunk

    def _read_line(self, deadline: float | None) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            line += self._read(1, deadline)
        return line

    def _read_exactly(self, count: int, deadline: float | None) -> bytes:
        parts, left = [], count
        while left:
            parts.append(self._read(min(left, 1 << 20), deadline))
            left -= len(parts[-1])
        return b"".join(parts)

    @property
    def usable(self) -> bool:
        return self.proc.poll() is None and self.answered < REUSES

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


class _Children:
    """The idle box processes of this process, by memory limit; one query per child at a time."""

    def __init__(self) -> None:
        self._idle: dict[int, list[_Child]] = {}
        self._lock = threading.Lock()

    def acquire(self, memory_limit_bytes: int) -> _Child:
        with self._lock:
            idle = self._idle.setdefault(memory_limit_bytes, [])
            while idle:
                child = idle.pop()
                if child.usable:
                    return child
                child.kill()
        return _Child(memory_limit_bytes)

    def release(self, child: _Child) -> None:
        with self._lock:
            idle = self._idle.setdefault(child.memory_limit, [])
            if child.usable and len(idle) < IDLE_CHILDREN:
                idle.append(child)
                return
        child.kill()

    def close(self) -> None:
        with self._lock:
            children = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for child in children:
            child.kill()


_CHILDREN = _Children()
atexit.register(_CHILDREN.close)


def arrow_reader(relation: Any) -> Any:
    """A streaming Arrow reader of a DuckDB relation, under the name this duckdb version gives it."""
    to_reader = getattr(relation, "to_arrow_reader", None)
    return to_reader() if to_reader is not None else relation.fetch_record_batch()


# -- the child ---------------------------------------------------------------------------------------------------


class _Refused(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _answer(request: dict[str, Any]) -> Any:
    """Run one request in a fresh in-memory database; the result table, or ``_Refused``."""
    import duckdb
    import pyarrow as pa

    tables = {name: pa.ipc.open_file(pa.memory_map(path)).read_all() for name, path in request["files"].items()}
    memory = f"the query needed more than {request['memory_limit'] // MIB} MiB and was stopped"
    con = duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "memory_limit": f"{request['memory_limit'] // MIB}MB",
            "threads": request["threads"],
            "temp_directory": "",
        },
    )
    try:
        for name, table in tables.items():
            con.register(name, table)
        con.execute("SET lock_configuration = true")
        limit, max_bytes = request["limit"], request["max_bytes"]
        reader = arrow_reader(con.sql(request["statement"]).limit(limit + 1))
        batches, total = [], 0
        for batch in reader:
            total += batch.nbytes
            if total > max_bytes:
                raise _Refused(
                    "bytes",
                    f"the result is larger than {max_bytes // MIB} MiB; select fewer columns or rows, or shorten "
                    "long values (for example with left(text, 200))",
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.OutOfMemoryException:
        raise _Refused("memory", memory) from None
    except duckdb.Error as error:
        text = str(error).strip()
        raise _Refused("error", text.splitlines()[0] if text else type(error).__name__) from None
    finally:
        con.close()


def _child(memory_limit_bytes: int) -> None:
    import resource
    import signal

    data_limit = memory_limit_bytes + HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
    # No file may grow: writing one fails with EFBIG instead of killing the child with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    import pyarrow as pa

    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        body = b""
        try:
            table = _answer(json.loads(line.decode("utf-8")))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            body = sink.getvalue().to_pybytes()
            header = {"bytes": len(body)}
        except _Refused as refused:
            header = {"kind": refused.kind, "message": str(refused)}
        except MemoryError:
            # The heap may be left in pieces: say so, and end this child (the parent starts another).
            out.write(json.dumps({"kind": "memory", "message": "the query ran out of memory"}).encode() + b"\n")
            out.flush()
            os._exit(3)
        out.write(json.dumps(header).encode("utf-8") + b"\n" + body)
        out.flush()


if __name__ == "__main__":
    _child(int(sys.argv[1]))
