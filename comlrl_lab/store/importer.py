"""Imports into the store: a CoMLRL ``preference_replay`` directory, or uploaded pair files (JSON or JSONL).

Every file is read and validated in full before anything is written; a malformed file is reported by name with the
reason and skipped, and all good files are then written in ONE transaction, so nothing is ever half-imported.
Accepted shapes: CoMLRL's round object ``{"iteration", "num_pairs", "pairs"}``, a bare JSON list of records (which
CoMLRL's loader also reads), and JSONL with one record per line. Provenance columns an export wrote beside the seed's
fields (``round``, ``item_index``, candidate indices, ``winner_side``) are read back, so a file whose every row names
its round fills those rounds: a JSONL export imports as the rounds it came from. These are functions over a ``RunStore``; the store
does not call back into them. This module does not export (``export``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.records import PreferencePair
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.store.runstore import RunStore
from comlrl_lab.store.writer import build_batch

_ITERATION_NAME = re.compile(r"iteration_(\d+)", re.IGNORECASE)
#: Rounds are DuckDB INTEGERs; a larger iteration would fail inside the one import transaction, hiding its file.
MAX_ROUND = 2**31 - 1
_PROVENANCE_INDICES = ("item_index", "winner_candidate_index", "loser_candidate_index")
_SIDES = ("current", "comparator")


class ImportRefused(ValueError):
    """The target store holds a training run: importing into it would replace that run's rounds."""


#: An uploaded file: a path, (name, bytes or text), or an object with ``.name`` and ``.getvalue()`` / ``.read()``
#: (Streamlit's UploadedFile).
PairFile = Any


@dataclass
class ImportReport:
    """What an import did: the files written, the files skipped with the reason, and the pairs written."""

    run_id: str
    imported_files: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: Entries of an imported directory that were not read, with the reason (not a .json file, a link out of it).
    ignored: list[tuple[str, str]] = field(default_factory=list)
    pairs: int = 0
    rounds: list[int] = field(default_factory=list)


@dataclass
class _Parsed:
    name: str
    iteration: int | None
    pairs: list[PreferencePair]


def parse_pair_file(name: str, data: bytes | str) -> tuple[int | None, list[PreferencePair]]:
    """Parse and validate one file; return (iteration or None, pairs). Raises ``ValueError`` with the reason."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    iteration: int | None = None
    if name.lower().endswith(".jsonl"):
        records = []
        for lineno, line in enumerate(data.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"line {lineno} is not valid JSON: {e.msg}") from None
                except RecursionError:
                    raise ValueError(f"line {lineno} is nested too deeply to be a pair record") from None
    else:
        try:
            payload = json.loads(data)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        except RecursionError:
            raise ValueError("nested too deeply to be a pair file") from None
        if isinstance(payload, list):
            records = payload
        elif isinstance(payload, dict):
            if not isinstance(payload.get("pairs"), list):
                raise ValueError("a JSON object must be CoMLRL's round format with a 'pairs' list")
            records = payload["pairs"]
            iteration = payload.get("iteration")
            if iteration is not None and (
                not isinstance(iteration, int) or isinstance(iteration, bool) or not 0 <= iteration <= MAX_ROUND
            ):
                raise ValueError(f"'iteration' must be an integer from 0 to {MAX_ROUND}, got {iteration!r}")
            declared = payload.get("num_pairs")
            if declared is not None and declared != len(records):
                raise ValueError(f"'num_pairs' is {declared!r} but the file holds {len(records)} pairs")
        else:
            raise ValueError(f"expected a list of pair records or a round object, got {type(payload).__name__}")
    pairs = []
    for i, record in enumerate(records):
        try:
            pair = PreferencePair.from_record(record, **_provenance(record))
        except RecursionError:
            raise ValueError(f"pair {i}: nested too deeply") from None
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueError(f"pair {i}: {e}") from None
        pair.winner_side = pair.winner_side or _infer_winner_side(pair)
        pairs.append(pair)
    return iteration, pairs


def _provenance(record: Any) -> dict[str, Any]:
    """The provenance columns a JSONL or table export writes beside the seed's fields (``round``, ``item_index``,
    the candidate indices, ``winner_side``), checked; {} for CoMLRL's records, which have none."""
    if not isinstance(record, dict):
        return {}
    out: dict[str, Any] = {}
    for key, name in (("round", "round_index"), *((k, k) for k in _PROVENANCE_INDICES)):
        value = record.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ROUND:
            raise ValueError(f"'{key}' must be an integer from 0 to {MAX_ROUND}, got {value!r}")
        out[name] = value
    side = record.get("winner_side")
    if side is not None:
        if side not in _SIDES:
            raise ValueError(f"'winner_side' must be one of {', '.join(_SIDES)} or null, got {side!r}")
        out["winner_side"] = side
    return out


def _by_round(name: str, iteration: int | None, pairs: list[PreferencePair]) -> list[_Parsed]:
    """A file whose every row names its round (an export of ours) goes to those rounds, in order; any other file is
    one round."""
    if iteration is not None or not pairs or any(p.round_index is None for p in pairs):
        return [_Parsed(name, iteration, pairs)]
    rounds: dict[int, list[PreferencePair]] = {}
    for pair in pairs:
        rounds.setdefault(int(pair.round_index), []).append(pair)
    return [_Parsed(name, round_, rounds[round_]) for round_ in sorted(rounds)]


def import_pair_files(store: RunStore, files: Iterable[PairFile], run_id: str | None = None) -> ImportReport:
    """Import uploaded pair files into ``run_id`` (a new run when None); one round per file.

    A file's round is its ``iteration`` (round object), else the number in an ``iteration_NNNN`` name, else the next
    free round. Rounds already in an existing imported run are replaced, as a phase committed again is; a store that
    holds a training run is refused (``ImportRefused``).
    """
    refuse_training_store(store)
    parsed, skipped = [], []
    for item in files:
        try:
            name, data = _read(item)
        except OSError as e:
            skipped.append((Path(str(getattr(item, "name", item))).name, f"could not be read: {e.strerror or e}"))
            continue
        try:
            iteration, pairs = parse_pair_file(name, data)
        except ValueError as e:
            skipped.append((name, str(e)))
            continue
        by_rows = _by_round(name, iteration, pairs)
        if len(by_rows) > 1 or by_rows[0].iteration is not None:
            parsed.extend(by_rows)
            continue
        if iteration is None:
            m = _ITERATION_NAME.search(Path(name).name)
            iteration = int(m.group(1)) if m and int(m.group(1)) <= MAX_ROUND else None
        parsed.append(_Parsed(name, iteration, pairs))
    return _write(store, parsed, skipped, run_id, default_name=parsed[0].name if parsed else "pairs")


def import_replay_dir(store: RunStore, path: str | os.PathLike[str], run_id: str | None = None) -> ImportReport:
    """Import a CoMLRL ``preference_replay`` directory (every ``*.json`` file in it) into ``run_id`` or a new run."""
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r} is not a directory")
    refuse_training_store(store)
    root = directory.resolve()
    files, ignored = [], []
    for entry in sorted(directory.iterdir()):
        if entry.suffix.lower() != ".json":
            kind = "a folder" if entry.is_dir() else "not a .json file"
            ignored.append((entry.name, f"{kind}; only iteration_NNNN.json round files are read"))
        elif not entry.resolve().is_relative_to(root):
            ignored.append((entry.name, "a link that leads out of the directory; not followed"))
        elif not entry.is_file():
            ignored.append((entry.name, "not a regular file"))
        else:
            files.append(entry)
    report = import_pair_files(store, files, run_id=run_id or _new_run_id(store, directory.name))
    report.ignored = ignored
    return report


def refuse_training_store(store: RunStore) -> None:
    """Raise ``ImportRefused`` when ``store`` holds a run that was not imported (a training run's own store)."""
    trained = store.trained_run_ids()
    if trained:
        raise ImportRefused(
            f"{store.path} holds the training run {trained[0]!r}; importing into it would replace "
            "that run's rounds. Import into a new store instead."
        )


def _read(item: PairFile) -> tuple[str, bytes | str]:
    if isinstance(item, (str, os.PathLike)):
        p = Path(item)
        return p.name, p.read_bytes()
    if isinstance(item, tuple) and len(item) == 2:
        return str(item[0]), item[1]
    name = Path(str(getattr(item, "name", "upload"))).name
    if hasattr(item, "getvalue"):
        return name, item.getvalue()
    return name, item.read()


def _write(
    store: RunStore, parsed: list[_Parsed], skipped: list[tuple[str, str]], run_id: str | None, default_name: str
) -> ImportReport:
    run_id = run_id or _new_run_id(store, Path(default_name).stem)
    report = ImportReport(run_id=run_id, skipped=skipped)
    taken: dict[int, str] = {}
    for p in parsed:
        if p.iteration is not None:
            if p.iteration in taken:
                report.skipped.append((p.name, f"iteration {p.iteration} already comes from {taken[p.iteration]}"))
                p.iteration = -1
            else:
                taken[p.iteration] = p.name
    existing = store.rounds(run_id)["round"].tolist() if store.run(run_id) else []
    next_round = max([*taken, *existing, 0]) + 1
    batches = []
    for p in parsed:
        if p.iteration == -1:
            continue
        if p.iteration is None:
            p.iteration, next_round = next_round, next_round + 1
        for pair in p.pairs:
            pair.round_index = p.iteration
        batches.append(build_batch(p.iteration, "collect", pairs=p.pairs))
        if p.name not in report.imported_files:  # a file of several rounds is named once
            report.imported_files.append(p.name)
        report.rounds.append(p.iteration)
        report.pairs += len(p.pairs)
    if batches:
        store.commit_batches(run_id, batches, source="import", status="imported")
    return report


def _new_run_id(store: RunStore, stem: str) -> str:
    run_id = new_run_id(stem, prefix="import", fallback="pairs")
    while store.run(run_id) is not None:  # the same file imported twice in one second, 4 hex digits alike
        run_id = new_run_id(stem, prefix="import", fallback="pairs")
    return run_id


def _infer_winner_side(pair: PreferencePair) -> str | None:
    """CoMLRL records do not say which side won; ``raw_rewards`` = [winner, loser] tells when it is unambiguous."""
    raw, target, comparator = pair.raw_rewards, pair.target_raw_reward, pair.comparator_raw_reward
    if raw is None or len(raw) != 2 or target is None or comparator is None or target == comparator:
        return None
    if raw[0] == target and raw[1] == comparator:
        return "current"
    if raw[0] == comparator and raw[1] == target:
        return "comparator"
    return None
