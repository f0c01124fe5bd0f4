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

This file is also the child's script: it imports only the standard library, duckdb and pyarrow, so that the child
starts without the package (``python -I sql_box.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
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
        try:
            done = subprocess.run(
                [sys.executable, "-I", __file__],
                input=json.dumps(request).encode("utf-8"),
                capture_output=True,
                timeout=timeout_s,
                env={"PATH": os.environ.get("PATH", "")},
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BoxError("time", f"the query ran longer than {timeout_s} s and was stopped") from None
        if done.returncode == 0:
            return pa.ipc.open_stream(done.stdout).read_all()
        raise _failure(done.returncode, done.stderr.decode("utf-8", "replace"), memory_limit_bytes)


def arrow_reader(relation: Any) -> Any:
    """A streaming Arrow reader of a DuckDB relation, under the name this duckdb version gives it."""
    to_reader = getattr(relation, "to_arrow_reader", None)
    return to_reader() if to_reader is not None else relation.fetch_record_batch()


def _failure(returncode: int, stderr: str, memory_limit_bytes: int) -> BoxError:
    for line in reversed(stderr.strip().splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and "kind" in report:
            return BoxError(str(report["kind"]), str(report["message"]))
    memory = f"the query needed more than {memory_limit_bytes // MIB} MiB and was stopped"
    if returncode < 0 or "memory" in stderr.lower() or "bad_alloc" in stderr:
        return BoxError("memory", memory)
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {returncode}"
    return BoxError("error", last)


# -- the child ---------------------------------------------------------------------------------------------------


def _report(kind: str, message: str) -> None:
    sys.stderr.write(json.dumps({"kind": kind, "message": message}) + "\n")
    sys.stderr.flush()
    os._exit(3)


def _child() -> None:
    import resource
    import signal

    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    data_limit = request["memory_limit"] + HEADROOM_BYTES
    resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
    # No file may grow: writing one fails with EFBIG instead of killing the child with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    import duckdb
    import pyarrow as pa

    tables = {name: pa.ipc.open_file(pa.memory_map(path)).read_all() for name, path in request["files"].items()}
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
    for name, table in tables.items():
        con.register(name, table)
    con.execute("SET lock_configuration = true")
    limit, max_bytes = request["limit"], request["max_bytes"]
    try:
        reader = arrow_reader(con.sql(request["statement"]).limit(limit + 1))
        batches, total = [], 0
        for batch in reader:
            total += batch.nbytes
            if total > max_bytes:
                _report(
                    "bytes",
                    f"the result is larger than {max_bytes // MIB} MiB; select fewer columns or rows, or shorten "
                    "long values (for example with left(text, 200))",
                )
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.OutOfMemoryException:
        _report("memory", f"the query needed more than {request['memory_limit'] // MIB} MiB and was stopped")
    except MemoryError:
        _report("memory", f"the query needed more than {request['memory_limit'] // MIB} MiB and was stopped")
    except duckdb.Error as error:
        text = str(error).strip()
        _report("error", text.splitlines()[0] if text else type(error).__name__)
    out = sys.stdout.buffer
    with pa.ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table)
    out.flush()


if __name__ == "__main__":
    _child()
