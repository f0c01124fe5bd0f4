"""Exports from the store: pair datasets (JSON, JSONL, Parquet, CSV), CoMLRL round files and Parquet snapshots.

JSON holds the seed's records exactly as ``PreferencePair.to_record()`` writes them (the nine keys in the seed page's
order, ``raw_rewards`` [] when absent, null targets). JSONL, Parquet and CSV hold one schema, ``PAIR_SCHEMA``: the
provenance columns (round, pair_index, item_index, candidate indices, winner_side, reward_gap), the nine fields,
``labels`` and TRL's joint ``prompt``, ``chosen``, ``rejected``, every integer int64 (CSV: lists as JSON text); the
dataset card (``card``) beside them gives ``datasets`` the same types for each. Bulk formats are written by DuckDB's
``COPY`` straight from the file; round files by Python's ``json`` so they match CoMLRL's bytes. Every file is written
under a temporary name and renamed, so a reader never sees half a file. An export never writes into a run folder
(but for its ``exports/`` folder), over a DuckDB file or over a README.md it did not write, and refuses an empty
destination and a run the store does not hold (``check_destination``, ``ExportError``), so an export can never
destroy the run it reads. These are functions over a ``RunStore`` (or the path of a store file, opened read-only for
the call); the store does not call back into them. TRL's per-agent datasets are in ``trl_export``. This module does
not import (``importer``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from comlrl_lab import __version__
from comlrl_lab.data.records import SEED_RECORD_FIELDS, round_file_payload
from comlrl_lab.data.reward_distribution import payload_from_rows, write_distribution_file
from comlrl_lab.store import queries
from comlrl_lab.store.card import CARD_FILE, CARD_MARKER, CardFacts, CardFile, RoundCount, RunAbout, dataset_card
from comlrl_lab.store.dataset_schema import CSV_JSON_COLUMNS, CSV_SCHEMA, PAIR_SCHEMA, select_as
from comlrl_lab.store.formats import CARD_FORMATS, PAIR_FORMATS
from comlrl_lab.store.runstore import RunStore
from comlrl_lab.store.schema import PHASE_TABLES


@contextmanager
def open_store(store_or_path: RunStore | str | os.PathLike[str]) -> Iterator[RunStore]:
    if isinstance(store_or_path, RunStore):
        yield store_or_path
        return
    store = RunStore(store_or_path, read_only=True)
    try:
        yield store
    finally:
        store.close()


class ExportError(RuntimeError):
    """An export could not be written; the message names the destination, and no ``.tmp`` file is left."""


#: What makes a folder a run folder (the engine's spec file and store file), and the one place in it exports may go.
RUN_FOLDER_FILES = ("spec.json", "run.duckdb")
EXPORTS_FOLDER = "exports"
_DUCKDB_MAGIC = b"DUCK"  # bytes 8 to 12 of every DuckDB database file


def check_destination(dest: str | os.PathLike[str] | None) -> Path:
    """``dest`` as a path, or ``ExportError`` when it is empty, a DuckDB file, or inside a run folder (its
    ``exports/`` folder excepted): an export must never replace a store, a spec or a checkpoint."""
    text = "" if dest is None else os.fspath(dest)
    if not text.strip():
        raise ExportError("the destination is empty: name a file for pairs, or a folder for round files")
    path = Path(text).expanduser()
    resolved = path.resolve()
    if resolved.suffix in (".duckdb", ".wal") or _is_duckdb(resolved):
        raise ExportError(f"{path} is a DuckDB store: an export never writes over a store; choose another file")
    for folder in (resolved, *resolved.parents):
        if any((folder / name).is_file() for name in RUN_FOLDER_FILES):
            inside = resolved.relative_to(folder).parts
            if len(inside) >= 2 and inside[0] == EXPORTS_FOLDER:
                break
            raise ExportError(
                f"{path} is inside the run folder {folder}: an export never writes into a run folder (its "
                f"{EXPORTS_FOLDER}/ folder excepted); choose a path outside it or under {folder / EXPORTS_FOLDER}"
            )
    return path


def _is_duckdb(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(12)[8:12] == _DUCKDB_MAGIC
    except OSError:
        return False


def check_run(store: RunStore, run_id: str) -> None:
    if store.run(run_id) is None:
        held = ", ".join(str(r) for r in store.list_runs()["run_id"]) or "none"
        raise ExportError(f"no run {run_id!r} in {store.path} (runs there: {held})")


@contextmanager
def written_through_tmp(dest: Path) -> Iterator[Path]:
    """A ``.tmp`` path to write, renamed onto ``dest`` on success and removed on failure."""
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException as error:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        if not isinstance(error, Exception) or isinstance(error, ExportError):
            raise
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].replace(str(tmp), str(dest))
        raise ExportError(f"could not write {dest}: {reason}") from error


def sql_path(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def export_pairs(
    store_or_path: RunStore | str | os.PathLike[str],
    run_id: str,
    fmt: str,
    dest: str | os.PathLike[str],
    *,
    card: bool = True,
    about: RunAbout | None = None,
    **filters: Any,
) -> int:
    """Write the run's pairs (all, or those matching the pair browser's ``filters``) to ``dest``; return the count.

    ``fmt``: "json" (one JSON list of the seed's records, exactly), or "jsonl", "parquet", "csv": the columns of
    ``PAIR_SCHEMA`` (provenance, the seed's nine fields, ``labels``, TRL's joint ``prompt``, ``chosen``,
    ``rejected``) with the same types in each; CSV holds the list columns as JSON text. Pairs are in (round,
    pair_index) order. With ``card``, a JSONL, Parquet or CSV export gets its dataset card beside it, ``README.md``
    in ``dest``'s folder (``about``: what the run's spec adds to it); a README.md there that is not such a card
    is never replaced: the export is refused before anything is written.
    """
    if fmt not in PAIR_FORMATS:
        raise ValueError(f"fmt must be one of {list(PAIR_FORMATS)}, got {fmt!r}")
    flt = queries.pair_filter(**filters)
    dest = check_destination(dest)
    card_at = card_path(dest.parent) if card and fmt in CARD_FORMATS else None
    if card_at is not None and dest.name == CARD_FILE:
        raise ExportError(f"{dest}: {CARD_FILE} is where the dataset card goes; name the file otherwise (or no card)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    facts = None
    with open_store(store_or_path) as store, written_through_tmp(dest) as tmp:
        check_run(store, run_id)
        cur = store.cursor()
        where, args = flt.where(run_id)
        # DuckDB keeps insertion order without ORDER BY; the sort is skipped while the file is in order (and no
        # join with the labels could have moved rows).
        in_order, labelled = cur.execute(
            "SELECT pairs_in_order, coalesce(json_extract_string(config_json, '$.preference_source'), 'reward') "
            "<> 'reward' FROM runs WHERE run_id = ?",
            [run_id],
        ).fetchone() or (True, False)
        order = "" if in_order and not labelled else " ORDER BY round, pair_index"
        if fmt == "json":  # the seed's records, exactly
            sql = f"SELECT {', '.join(SEED_RECORD_FIELDS)} FROM pair_records WHERE {where}{order}"
            options = "FORMAT json, ARRAY true"
        else:
            schema = CSV_SCHEMA if fmt == "csv" else PAIR_SCHEMA
            columns = select_as(schema, _pair_expressions(as_json=fmt == "csv"))
            sql = f"SELECT {columns} FROM ({decided_pairs(labelled)}) WHERE {where}{order}"
            options = copy_options(fmt)
        count = int(cur.execute(f"COPY ({sql}) TO {sql_path(tmp)} ({options})", args).fetchone()[0])
        if fmt == "json" and count == 0:
            tmp.write_text("[]", encoding="utf-8")  # DuckDB writes an empty file for zero rows
        if card_at is not None:
            file = CardFile("default", dest.name, CSV_SCHEMA if fmt == "csv" else PAIR_SCHEMA, count, file_sha256(tmp))
            rounds = round_counts(cur, run_id, flt, labelled, exported_only=False)
            facts = CardFacts(
                store.run(run_id) or {}, "pairs", fmt, [file], rounds, _shown(filters), about or RunAbout()
            )
    if card_at is not None and facts is not None:  # after the data file is in place
        write_card(card_at, facts)
    return count


def export_round_files(
    store_or_path: RunStore | str | os.PathLike[str], run_id: str, dest_dir: str | os.PathLike[str]
) -> list[Path]:
    """Write each collected round as ``iteration_NNNN.json`` in CoMLRL's format; return the paths written.

    As CoMLRL does, a round that collected no pair still gets its (empty) file. Written with ``ensure_ascii=False``
    and no indent, through a ``.tmp`` file and an atomic rename, as CoMLRL writes them.
    """
    dest_dir = check_destination(dest_dir)
    written = []
    with open_store(store_or_path) as store:
        check_run(store, run_id)
        dest_dir.mkdir(parents=True, exist_ok=True)
        cur = store.cursor()
        collected = [
            r
            for (r,) in cur.execute(
                "SELECT round FROM phases WHERE run_id = $1 AND phase = 'collect' UNION "
                "SELECT DISTINCT round FROM pairs WHERE run_id = $1 ORDER BY 1",
                [run_id],
            ).fetchall()
        ]
        for round_ in collected:
            pairs = queries.load_pairs(cur, run_id, queries.PairFilter(round=round_))
            path = dest_dir / f"iteration_{int(round_):04d}.json"
            with written_through_tmp(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
                json.dump(round_file_payload(int(round_), pairs), f, ensure_ascii=False)
            written.append(path)
    return written


def export_reward_distribution_files(
    store_or_path: RunStore | str | os.PathLike[str], run_id: str, dest_dir: str | os.PathLike[str]
) -> list[Path]:
    """Write each round's logged reward distribution as CoMLRL's ``iteration_NNNN.json`` in ``dest_dir``.

    Only runs with ``log_reward_distribution`` have them; for others nothing is written and [] is returned.
    """
    dest_dir = check_destination(dest_dir)
    with open_store(store_or_path) as store:
        check_run(store, run_id)
        frame = queries.binned_reward_distributions(store.cursor(), run_id)
    return [
        write_distribution_file(dest_dir, payload_from_rows(int(round_), part.to_dict("records")))
        for round_, part in frame.groupby("round", sort=True)
    ]


#: Tables a snapshot copies whole: they belong to the run, not to one phase (labels are written as people give them).
WHOLE_TABLES: tuple[str, ...] = ("runs", "rounds", "phases", "labels")


def snapshot_parquet(
    store_or_path: RunStore | str | os.PathLike[str],
    run_id: str,
    dest_dir: str | os.PathLike[str],
    *,
    round: int | None = None,
    phase: str | None = None,
    tables: tuple[str, ...] = PHASE_TABLES,
    repair: bool = False,
) -> list[Path]:
    """Parquet files of one run for notebooks and other processes (which cannot open the DuckDB file while the app
    holds it); return the paths written.

    Layout (one ``dest_dir`` per run): ``dest_dir/<table>/round_NNNN_<phase>.parquet`` for each phase table
    (candidates, pairs, replay, metrics, events; none when the phase added no rows to it) plus ``runs.parquet``,
    ``rounds.parquet`` and ``phases.parquet`` rewritten whole. With ``round`` and ``phase`` only that finished phase
    is written (only its ``tables``: a checkpoint's cost adds metrics alone). Without, every committed phase is brought
    up to date: ``_manifest.json`` remembers each phase's commit time, so unchanged phases are not rewritten and
    discarded ones are removed; with ``repair`` (a run being opened), a phase with a file that is no Parquet any more
    (a crash, a bad copy) is written again. Read a table back with ``pandas.read_parquet(dest_dir / "pairs")`` or
    DuckDB ``read_parquet('dest_dir/pairs/*.parquet')``.
    """
    if (round is None) != (phase is None):
        raise ValueError("give both round and phase, or neither")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = dest_dir / "_manifest.json"
    manifest = _read_manifest(manifest_path, run_id)
    written: list[Path] = []
    with open_store(store_or_path) as store:
        cur = store.cursor()
        committed = {
            f"round_{int(r):04d}_{p}": str(at)
            for r, p, at in cur.execute(
                "SELECT round, phase, committed_at FROM phases WHERE run_id = ?", [run_id]
            ).fetchall()
        }
        if round is not None:
            wanted = [f"round_{int(round):04d}_{phase}"]
        else:
            for stale in set(manifest) - set(committed):
                for table in PHASE_TABLES:
                    (dest_dir / table / f"{stale}.parquet").unlink(missing_ok=True)
                del manifest[stale]
            for key in [
                k
                for k in manifest
                if repair and not all(is_parquet(dest_dir / t / f"{k}.parquet") for t in PHASE_TABLES)
            ]:
                del manifest[key]
            wanted = sorted(k for k in committed if manifest.get(k) != committed[k])
        for key in wanted:
            r, p = int(key[6:10]), key[11:]
            where, args = "run_id = ? AND round = ? AND phase = ?", [run_id, r, p]
            for table in tables:
                path = dest_dir / table / f"{key}.parquet"
                if cur.execute(f"SELECT count(*) FROM {table} WHERE {where}", args).fetchone()[0]:
                    path.parent.mkdir(exist_ok=True)
                    written.append(_copy(cur, f"SELECT * FROM {table} WHERE {where}", args, path))
                else:
                    path.unlink(missing_ok=True)  # a phase committed again with no rows leaves no stale file
            if key in committed:
                manifest[key] = committed[key]
        for table in WHOLE_TABLES:
            path = dest_dir / f"{table}.parquet"
            written.append(_copy(cur, f"SELECT * FROM {table} WHERE run_id = ?", [run_id], path))
    with written_through_tmp(manifest_path) as tmp:
        tmp.write_text(json.dumps({"run_id": run_id, "phases": manifest}, indent=1), encoding="utf-8")
    return written


def is_parquet(path: Path) -> bool:
    """True for a readable Parquet footer, and for no file at all (a phase that added no rows to a table)."""
    if not path.exists():
        return True
    try:
        pq.read_metadata(path)
    except (OSError, ValueError, pa.ArrowException):
        return False
    return True


def store_from_snapshot(snapshot_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> RunStore:
    """A new store at ``dest`` holding what a run's snapshot holds (its last committed phase), for exports.

    The run's own DuckDB file may be held by another process (the workbench keeps open the runs it shows, a CLI
    run holds its own), which locks every other process out; its snapshot can always be read. Files written by an
    older version lack newer columns, which take their defaults.
    """
    snapshot_dir = Path(snapshot_dir)
    if not (snapshot_dir / "runs.parquet").is_file():
        raise FileNotFoundError(f"{snapshot_dir} holds no snapshot (no runs.parquet): no phase was committed")
    store = RunStore(dest)
    try:
        tables = {name: [snapshot_dir / f"{name}.parquet"] for name in WHOLE_TABLES}
        tables = {name: files for name, files in tables.items() if files[0].is_file()}  # labels: since version 4
        tables.update({name: sorted((snapshot_dir / name).glob("*.parquet")) for name in PHASE_TABLES})
        store.load_parquet({name: files for name, files in tables.items() if files})
    except BaseException:
        store.close()
        raise
    return store


def _read_manifest(path: Path, run_id: str) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("run_id") != run_id or not isinstance(data.get("phases"), dict):
        return {}
    return {str(k): str(v) for k, v in data["phases"].items()}


def _copy(cur: Any, sql: str, args: list[Any], path: Path) -> Path:
    with written_through_tmp(path) as tmp:
        cur.execute(f"COPY ({sql}) TO {sql_path(tmp)} (FORMAT parquet, COMPRESSION zstd)", args).fetchall()
    return path


# -- the labels and TRL's columns of a pair export ---------------------------------------------------------------

#: One row per labelled comparison: its labels (labeller, verdict) in the order given, and the votes for each
#: stored side (verdict A prefers the side shown as A, ``a_side``; B the other; tie and both bad neither).
VOTES_SQL = """
    SELECT run_id, round, pair_index,
           list({'labeller': labeller, 'verdict': verdict} ORDER BY labelled_at, labeller) AS labels,
           count(*) AS votes,
           count(*) FILTER (WHERE (verdict = 'A') = (a_side = 'winner') AND verdict IN ('A', 'B')) AS for_winner,
           count(*) FILTER (WHERE (verdict = 'A') = (a_side = 'loser') AND verdict IN ('A', 'B')) AS for_loser,
           count(*) FILTER (WHERE verdict = 'tie') AS ties,
           count(*) FILTER (WHERE verdict = 'both_bad') AS both_bad
    FROM labels GROUP BY ALL"""

_NO_LABELS = "[]::STRUCT(labeller VARCHAR, verdict VARCHAR)[]"


def decided_pairs(labelled: bool) -> str:
    """SQL of ``pair_records`` with ``labels``, ``chosen_side`` and ``left_out``.

    A run the reward function labels chooses its stored winner. A run people or a judge label choose the side more
    than half the labels prefer (``chosen_side`` "winner" or "loser", as the select phase does); a comparison
    without one has no ``chosen_side`` and says why in ``left_out``: "tie" or "both_bad" (every label says so),
    "split" (any other disagreement) or "awaiting_labels" (none yet).
    """
    if not labelled:
        return f"SELECT *, {_NO_LABELS} AS labels, 'winner' AS chosen_side, NULL::VARCHAR AS left_out FROM pair_records"
    majority = "CASE WHEN 2 * v.for_winner > v.votes THEN 'winner' WHEN 2 * v.for_loser > v.votes THEN 'loser' END"
    return f"""
        SELECT p.*, coalesce(v.labels, {_NO_LABELS}) AS labels, {majority} AS chosen_side,
               CASE WHEN {majority} IS NOT NULL THEN NULL
                    WHEN v.votes IS NULL THEN 'awaiting_labels'
                    WHEN v.ties = v.votes THEN 'tie'
                    WHEN v.both_bad = v.votes THEN 'both_bad'
                    ELSE 'split' END AS left_out
        FROM pair_records p LEFT JOIN ({VOTES_SQL}) v USING (run_id, round, pair_index)"""


def _joint(column: str) -> str:
    """SQL for a joint response (or the agents' prompts) as one text, as ``data.labels.joint_text`` writes it."""
    numbered = f"list_transform(range(1, len({column}) + 1), lambda i: '[Agent ' || i || ']' || chr(10) || {column}[i])"
    return f"CASE WHEN len({column}) = 1 THEN {column}[1] ELSE array_to_string({numbered}, chr(10)) END"


def _pair_expressions(*, as_json: bool) -> dict[str, str]:
    """TRL's joint ``prompt``, ``chosen`` and ``rejected`` over ``decided_pairs``: empty (NULL) where no side is
    chosen, as such a comparison trains on nothing; with ``as_json`` (CSV) every list column as its JSON text."""
    winner, loser = _joint("winner_completions"), _joint("loser_completions")
    expressions = {
        "prompt": _joint("prompts"),
        "chosen": f"CASE chosen_side WHEN 'winner' THEN {winner} WHEN 'loser' THEN {loser} END",
        "rejected": f"CASE chosen_side WHEN 'winner' THEN {loser} WHEN 'loser' THEN {winner} END",
    }
    if as_json:
        expressions.update({name: f"to_json({name})" for name in CSV_JSON_COLUMNS})
    return expressions


# -- dataset cards ---------------------------------------------------------------------------------------------


def card_path(folder: Path) -> Path:
    """Where the card of an export into ``folder`` goes; ``ExportError`` when a README.md that no export wrote is
    there (it is someone's own file: an export never replaces it)."""
    path = folder / CARD_FILE
    if path.exists():
        try:
            ours = CARD_MARKER in path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            ours = False
        if not ours:
            raise ExportError(
                f"{path} exists and is not a comlrl-lab dataset card: an export never replaces it; export into "
                "another folder (or pass card=False / --no-card)"
            )
    return path


def write_card(path: Path, facts: CardFacts) -> None:
    """Write ``facts``' card to ``path`` (through a ``.tmp``), once the data files it describes are in place."""
    with written_through_tmp(path) as tmp:
        tmp.write_text(dataset_card(replace(facts, version=__version__)), encoding="utf-8")


def round_counts(
    cur: Any, run_id: str, flt: queries.PairFilter, labelled: bool, *, exported_only: bool
) -> list[RoundCount]:
    """Per collected round: comparisons stored, those ``flt`` exports (with ``exported_only``, only those with a
    chosen side, as TRL files hold), and why the others it matched have none."""
    where, args = flt.where(run_id)
    kept = "chosen_side IS NOT NULL" if exported_only else "true"
    rows = cur.execute(
        f"""
        WITH matched AS (SELECT round, chosen_side, left_out FROM ({decided_pairs(labelled)}) WHERE {where}),
        stored AS (
            SELECT round FROM rounds WHERE run_id = ? AND (collect_at IS NOT NULL OR num_pairs > 0)
            UNION SELECT DISTINCT round FROM pairs WHERE run_id = ?)
        SELECT s.round,
               (SELECT count(*) FROM pairs p WHERE p.run_id = ? AND p.round = s.round),
               (SELECT count(*) FROM matched m WHERE m.round = s.round AND {kept}),
               (SELECT coalesce(map_from_entries(list({{'k': left_out, 'v': n}})), MAP {{}})
                FROM (SELECT left_out, count(*) AS n FROM matched m
                      WHERE m.round = s.round AND left_out IS NOT NULL GROUP BY left_out))
        FROM stored s ORDER BY s.round""",
        [*args, run_id, run_id, run_id],
    ).fetchall()
    return [RoundCount(int(r), int(stored), int(exported), dict(left or {})) for r, stored, exported, left in rows]


def copy_options(fmt: str) -> str:
    """DuckDB's ``COPY`` options for a table format: JSON lines, Parquet (zstd) or CSV with a header."""
    if fmt == "parquet":
        return "FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1, ROW_GROUP_SIZE 100000"
    if fmt == "csv":
        return "FORMAT csv, HEADER true"
    return "FORMAT json"


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _shown(filters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if v is not None}
