"""The read-only SQL entry point: accept one query that only reads the store, run it, and roll it back.

Before any parsing the text is bounded: at most ``MAX_QUERY_CHARS`` characters and ``MAX_NESTING`` levels of
parentheses (a 23 MB query took the app's process to 5 GB in DuckDB's parser; 400 nested expressions overflowed
Python's recursion reading the parsed tree, which is now walked without recursion). Then three guards, each enough
on its own for the common cases, together for the odd ones:
1. DuckDB's own parser (``duckdb.extract_statements``): exactly one statement, of type SELECT or EXPLAIN
   (SHOW, DESCRIBE, SUMMARIZE, FROM-first and WITH parse as SELECT).
2. A keyword scan of the text with comments, string literals and quoted names blanked out, so a write hidden in a
   CTE (``WITH x AS (DELETE ... RETURNING *) SELECT ...``) or after a comment is still refused.
3. The parsed tree (``json_serialize_sql``): no data-modifying query node, only the store's tables and views, CTE
   names and a short list of catalog and generator table functions; no file readers, replacement scans of file
   names, sequences or other side-effecting functions.
The query then runs in the SQL box (``sql_box``): a child process with DuckDB's own guards (no file access,
locked configuration, a memory limit, a thread cap), a row limit, a byte limit and a time limit. This module does not know the UI; it only answers DataFrames or ``ReadOnlyQueryError``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import duckdb
import pandas as pd

from comlrl_lab.store import sql_box
from comlrl_lab.store.schema import READABLE_RELATIONS


class ReadOnlyQueryError(ValueError):
    """The query was refused: it is not a single statement that only reads the store."""


class QueryExecutionError(RuntimeError):
    """An accepted query failed while running (a typo, a missing column, the time limit)."""


#: Characters of SQL text the box accepts; a long hand-written query has a few thousand.
MAX_QUERY_CHARS = 100_000
#: Levels of nested parentheses (subqueries, calls, grouping) outside strings and comments.
MAX_NESTING = 64
#: Levels of the parsed tree (``json_serialize_sql``) read. A 100-term ``1+1+...`` chain is about 300 and 64 nested
#: calls about 200; the bound is checked on the text, since how deep ``json.loads`` can go depends on the process's
#: recursion limit, which other libraries raise (``torch.compile`` sets it to 2000).
MAX_TREE_DEPTH = 500


FORBIDDEN_KEYWORDS: tuple[str, ...] = (
    "insert", "update", "delete", "drop", "create", "alter", "attach", "detach", "copy", "export", "import",
    "install", "load", "set", "reset", "pragma", "call", "checkpoint", "vacuum", "truncate", "merge", "use",
    "prepare", "execute", "deallocate", "begin", "commit", "rollback", "abort", "grant", "revoke",
)  # fmt: skip

#: Functions that touch files, the environment, sequences or the RNG; refused whether called as scalar or table.
DENIED_FUNCTION_PATTERN = re.compile(
    r"^(read_\w+|glob|sniff_csv|parquet_\w+|query|query_table|nextval|setseed|getenv|checkpoint|force_checkpoint"
    r"|sqlite_\w+|postgres_\w+|mysql_\w+|delta_scan|iceberg_\w+|duckdb_secrets|duckdb_extensions|load_\w+"
    r"|install_\w+|\w+_scan|write_\w+)$"
)

ALLOWED_TABLE_FUNCTIONS: frozenset[str] = frozenset(
    {
        "range", "generate_series", "unnest", "json_each", "json_tree", "pragma_table_info", "pragma_show",
        "duckdb_tables", "duckdb_columns", "duckdb_views", "duckdb_schemas", "duckdb_types", "duckdb_indexes",
        "duckdb_constraints", "duckdb_functions", "duckdb_databases", "duckdb_settings", "duckdb_keywords",
    }
)  # fmt: skip
SYSTEM_VIEWS: frozenset[str] = frozenset(f for f in ALLOWED_TABLE_FUNCTIONS if f.startswith("duckdb_"))
#: The catalog views DuckDB defines in its two system schemas. Any other name there is not a view: DuckDB would
#: fall back to reading a file of that name (``pg_catalog."secret.csv"`` reads ./pg_catalog.secret.csv).
SYSTEM_SCHEMA_VIEWS: dict[str, frozenset[str]] = {
    "information_schema": frozenset(
        {
            "character_sets", "check_constraints", "columns", "constraint_column_usage", "constraint_table_usage",
            "key_column_usage", "referential_constraints", "schemata", "table_constraints", "tables", "views",
        }
    ),
    "pg_catalog": frozenset(
        {
            "pg_am", "pg_attrdef", "pg_attribute", "pg_class", "pg_collation", "pg_constraint", "pg_database",
            "pg_depend", "pg_description", "pg_enum", "pg_index", "pg_indexes", "pg_namespace",
            "pg_prepared_statements", "pg_proc", "pg_sequence", "pg_sequences", "pg_settings", "pg_tables",
            "pg_tablespace", "pg_type", "pg_views",
        }
    ),
}  # fmt: skip

_ALLOWED_TYPES = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
_KEYWORD_RE = re.compile(r"\b(" + "|".join(FORBIDDEN_KEYWORDS) + r")\b", re.IGNORECASE)
_CALL_RE = re.compile(r"\b([a-z_][a-z0-9_]*)\s*\(", re.IGNORECASE)
_EXPLAIN_RE = re.compile(r"^\s*explain\s+(analyze\s+)?", re.IGNORECASE)
# One token at a time: comments, '...' strings (with '' escapes), "..." names, $tag$...$tag$ strings.
_LEXEME_RE = re.compile(
    r"--[^\n]*|/\*.*?(?:\*/|\Z)|'(?:[^']|'')*(?:'|\Z)|\"(?:[^\"]|\"\")*(?:\"|\Z)|\$(\w*)\$.*?(?:\$\1\$|\Z)",
    re.DOTALL,
)


def blank_out(sql: str, *, keep_literals: bool = False) -> str:
    """``sql`` with comments (and, unless ``keep_literals``, strings and quoted names) replaced by spaces."""

    def repl(m: re.Match[str]) -> str:
        text = m.group(0)
        if keep_literals and not text.startswith(("--", "/*")):
            return text
        return " " * len(text)

    return _LEXEME_RE.sub(repl, sql)


def check_readonly(
    con: duckdb.DuckDBPyConnection, query: str, *, extra_relations: frozenset[str] = frozenset()
) -> tuple[str, set[str]]:
    """The single statement to run and the store relations it names, or ``ReadOnlyQueryError`` saying why not."""
    if not isinstance(query, str) or not query.strip():
        raise ReadOnlyQueryError("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ReadOnlyQueryError(f"the query is {len(query):,} characters long; at most {MAX_QUERY_CHARS:,} are read")
    depth = _nesting(blank_out(query))
    if depth > MAX_NESTING:
        raise ReadOnlyQueryError(f"the query nests parentheses {depth} deep; at most {MAX_NESTING} levels are read")
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as e:
        raise ReadOnlyQueryError(f"the query could not be parsed: {_first_line(e)}") from e
    if len(statements) != 1:
        raise ReadOnlyQueryError(f"only one statement is allowed, found {len(statements)}")
    kind = statements[0].type
    bare = blank_out(query)
    if kind not in _ALLOWED_TYPES:
        first = (bare.split() or [""])[0].lower()
        verb = first.upper() if first in FORBIDDEN_KEYWORDS else kind.name
        raise ReadOnlyQueryError(
            f"{verb} is not allowed: only read-only queries (SELECT, WITH, FROM, SHOW, DESCRIBE, SUMMARIZE, EXPLAIN)"
        )
    found = _KEYWORD_RE.search(bare)
    if found:
        raise ReadOnlyQueryError(f"the keyword {found.group(1).upper()} is not allowed in a read-only query")
    for call in _CALL_RE.finditer(bare):
        if DENIED_FUNCTION_PATTERN.match(call.group(1).lower()):
            raise ReadOnlyQueryError(f"the function {call.group(1)}() is not allowed in a read-only query")
    statement = blank_out(query, keep_literals=True).strip().rstrip(";").strip()
    inner = _EXPLAIN_RE.sub("", statement, count=1) if kind == duckdb.StatementType.EXPLAIN else statement
    tree_text = con.execute("SELECT json_serialize_sql(?)", [inner]).fetchone()[0]
    too_deep = "the query's expressions are nested too deeply to be checked"
    if _json_nests_deeper_than(tree_text, MAX_TREE_DEPTH):  # a chain such as 1+1+...+1 nests without parentheses
        raise ReadOnlyQueryError(too_deep)
    try:
        serialized = json.loads(tree_text)
    except RecursionError:  # a caller already deep in its own stack
        raise ReadOnlyQueryError(too_deep) from None
    if serialized.get("error"):
        raise ReadOnlyQueryError(f"the query is not a plain read: {serialized.get('error_message', 'unknown')}")
    named: set[str] = set()
    _check_tree(serialized["statements"], READABLE_RELATIONS | extra_relations | _cte_names(serialized), named)
    return statement, named & (READABLE_RELATIONS | extra_relations)


def run_readonly(
    con: duckdb.DuckDBPyConnection,
    query: str,
    *,
    limit: int = 1000,
    timeout_s: float | None = 30.0,
    max_bytes: int = sql_box.MAX_RESULT_BYTES,
    extra_relations: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """Check ``query``, then run it in the SQL box (``sql_box``) over the relations of ``con`` it names.

    At most ``limit`` rows and ``max_bytes`` bytes come back; ``df.attrs["truncated"]`` is True when the query had
    more rows than ``limit``. The relations are read from ``con`` in one rolled-back transaction, so they agree.
    """
    if int(limit) < 1:
        raise ValueError(f"limit must be at least 1, got {limit!r}")
    cur = con.cursor()
    with sql_box.Box() as box:
        try:
            statement, named = check_readonly(cur, query, extra_relations=extra_relations)
            cur.execute("BEGIN TRANSACTION")
            try:
                for name in sorted(READABLE_RELATIONS | extra_relations):
                    # Relations the query does not name go in empty, so catalog queries still list every one.
                    rows = "" if name in named else " LIMIT 0"
                    box.add(name, sql_box.arrow_reader(cur.sql(f'SELECT * FROM "{name}"{rows}')))
            finally:
                cur.execute("ROLLBACK")
        finally:
            cur.close()
        try:
            table = box.run(statement, limit=int(limit), timeout_s=timeout_s, max_bytes=max_bytes)
        except sql_box.BoxError as e:
            raise QueryExecutionError(str(e)) from None
    df = table.to_pandas()
    truncated = len(df) > int(limit)
    df = df.iloc[: int(limit)].reset_index(drop=True)
    df.attrs["truncated"] = truncated
    return df


def _nesting(bare: str) -> int:
    """The deepest level of parentheses in ``bare`` (the query with strings and comments blanked out)."""
    depth = deepest = 0
    for char in bare:
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


_JSON_TOKEN_RE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json_nests_deeper_than(text: str, limit: int) -> bool:
    """Whether arrays and objects in the JSON ``text`` nest more than ``limit`` deep; read without recursion, and
    only as far as the first level past ``limit``."""
    depth = 0
    for token in _JSON_TOKEN_RE.finditer(text):
        char = token.group(0)
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _nodes(tree: Any) -> Any:
    """Every dict in a parsed tree, depth first, without recursion (a deep tree must not overflow the stack)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(reversed([v for v in node.values() if isinstance(v, (dict, list))]))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def _cte_names(tree: Any) -> frozenset[str]:
    names: set[str] = set()
    for node in _nodes(tree):
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            names.update(str(entry.get("key", "")).lower() for entry in cte_map.get("map", []))
    return frozenset(names)


def _check_tree(tree: Any, relations: frozenset[str], named: set[str]) -> None:
    for node in _nodes(tree):
        _check_node(node, relations, named)


def _check_node(node: dict[str, Any], relations: frozenset[str], named: set[str]) -> None:
    kind = node.get("type")
    if isinstance(kind, str) and kind.endswith("_QUERY_NODE"):
        verb = kind.removesuffix("_QUERY_NODE")
        raise ReadOnlyQueryError(f"the query contains a {verb} inside it; only reads are allowed")
    is_show_of_table = kind == "SHOW_REF" and node.get("show_type") != "SHOW_SPECIAL" and node.get("table_name")
    if kind == "BASE_TABLE" or is_show_of_table:
        named.add(_check_relation(node, relations))
    elif kind == "TABLE_FUNCTION":
        name = str((node.get("function") or {}).get("function_name", "")).lower()
        if name not in ALLOWED_TABLE_FUNCTIONS:
            raise ReadOnlyQueryError(
                f"the table function {name}() is not allowed; use the store's tables "
                f"({', '.join(sorted(READABLE_RELATIONS))})"
            )
    if node.get("class") == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        if DENIED_FUNCTION_PATTERN.match(name):
            raise ReadOnlyQueryError(f"the function {name}() is not allowed in a read-only query")


def _check_relation(node: dict[str, Any], relations: frozenset[str]) -> str:
    """The relation's name when it is one of the store's, a CTE or a catalog view; else refused."""
    name = str(node.get("table_name", "")).strip('"').lower()
    schema = str(node.get("schema_name", "") or "").lower()
    # A catalog part ("/dir/x".information_schema."*.csv") can only be a file path or another database.
    if not node.get("catalog_name"):
        if name in SYSTEM_SCHEMA_VIEWS.get(schema, ()):
            return name
        if schema in ("", "main") and (name in relations or name in SYSTEM_VIEWS):
            return name
    raise ReadOnlyQueryError(
        f"{node.get('table_name')!r} is not a table of this store; readable: {', '.join(sorted(READABLE_RELATIONS))}"
    )
