"""Labels in and out of a run's store for outside tools: the comparisons still waiting, and verdicts read back.

``export_waiting`` writes every comparison of the rounds whose label phase has not been committed that has fewer
than ``labels_per_comparison`` labels, blinded as the labelling view shows it (response A and B in the recorded
order), as JSON lines or CSV with empty ``labeller`` and ``verdict`` columns to fill in. ``import_labels`` reads
such a file back: each row is checked against the run's comparisons (round, pair_index) and verdicts; a bad row is
named by its line and skipped, and a labeller's verdict already in the store is kept (an import never overwrites).
The file is bounded (size and rows) and refused whole, with one line, before anything is written when it is not.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.labels import A_SIDE_KEY, Label, check_verdict, group_labels, joint_text, shown_sides
from comlrl_lab.store.runstore import RunStore

LABEL_FILE_FORMATS: tuple[str, ...] = ("jsonl", "csv")
MAX_LABEL_FILE_BYTES = 64 * 1024 * 1024
MAX_LABEL_ROWS = 1_000_000
COLUMNS = ("round", "pair_index", "item_index", "prompt", "response_a", "response_b", "labeller", "verdict")


@dataclass
class LabelImport:
    """What an import wrote and what it skipped (one line per bad row, naming it)."""

    written: int = 0
    kept: int = 0  # rows a labeller had already labelled: the stored verdict stays
    skipped: list[str] = field(default_factory=list)


def labels_needed(store: RunStore, run_id: str) -> int:
    info = store.run(run_id) or {}
    config = json.loads(info.get("config_json") or "{}")
    return int(config.get("labels_per_comparison", 1))


def waiting_rows(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    """The comparisons still waiting for labels, as export rows (blinded)."""
    committed = {(r, p) for r, p in store.committed_phases(run_id)}
    needed = labels_needed(store, run_id)
    rows = []
    for pair in store.load_pairs(run_id):
        round_index = int(pair.round_index)
        if A_SIDE_KEY not in pair.extra or (round_index, "label") in committed:
            continue
        rows.append((round_index, pair))
    have = group_labels(store.labels(run_id))
    out = []
    indices: dict[int, int] = {}
    for round_index, pair in rows:
        index = indices.get(round_index, 0)
        indices[round_index] = index + 1
        if len(have.get((round_index, index), ())) >= needed:
            continue
        a, b = shown_sides(pair)
        out.append(
            {
                "round": round_index,
                "pair_index": index,
                "item_index": pair.item_index,
                "prompt": joint_text(list(dict.fromkeys(pair.prompts))),
                "response_a": joint_text(a),
                "response_b": joint_text(b),
                "labeller": "",
                "verdict": "",
            }
        )
    return out


def export_waiting(store: RunStore, run_id: str, fmt: str, dest: str | os.PathLike[str]) -> int:
    if fmt not in LABEL_FILE_FORMATS:
        raise ValueError(f"format must be one of {', '.join(LABEL_FILE_FORMATS)}, got {fmt!r}")
    rows = waiting_rows(store, run_id)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        if fmt == "jsonl":
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    os.replace(tmp, dest)
    return len(rows)


def _read_rows(path: Path) -> list[tuple[int, Any]]:
    size = path.stat().st_size
    if size > MAX_LABEL_FILE_BYTES:
        raise ValueError(f"{path} is {size} bytes, more than a label file may be ({MAX_LABEL_FILE_BYTES})")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        rows = [(reader.line_num, row) for row in reader]
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except ValueError as error:
                rows.append((number, f"not JSON ({error.msg})"))
    if len(rows) > MAX_LABEL_ROWS:
        raise ValueError(f"{path} has {len(rows)} rows, more than a label file may have ({MAX_LABEL_ROWS})")
    return rows


def import_labels(store: RunStore, run_id: str, path: str | os.PathLike[str]) -> LabelImport:
    """Read verdicts from a JSONL or CSV file (round, pair_index, labeller, verdict) into the store."""
    path = Path(path)
    comparisons: dict[tuple[int, int], str] = {}
    counters: dict[int, int] = {}
    for pair in store.load_pairs(run_id):
        if A_SIDE_KEY in pair.extra:
            index = counters.get(int(pair.round_index), 0)
            counters[int(pair.round_index)] = index + 1
            comparisons[(int(pair.round_index), index)] = pair.extra[A_SIDE_KEY]
    report = LabelImport()
    labels: list[Label] = []
    for number, row in _read_rows(path):
        where = f"line {number}"
        if isinstance(row, str):
            report.skipped.append(f"{where}: {row}")
            continue
        if not isinstance(row, dict):
            report.skipped.append(f"{where}: not an object")
            continue
        try:
            key = (int(row.get("round")), int(row.get("pair_index")))
        except (TypeError, ValueError):
            report.skipped.append(f"{where}: round and pair_index must be integers")
            continue
        if key not in comparisons:
            report.skipped.append(f"{where}: no comparison round {key[0]} pair {key[1]} in run {run_id}")
            continue
        labeller = str(row.get("labeller") or "").strip()
        if not labeller:
            report.skipped.append(f"{where}: no labeller")
            continue
        try:
            verdict = check_verdict(row.get("verdict"))
        except ValueError as error:
            report.skipped.append(f"{where}: {error}")
            continue
        labels.append(Label(key[0], key[1], labeller, verdict, comparisons[key]))
    unique = {(x.round, x.pair_index, x.labeller): x for x in labels}  # a labeller's last row of a comparison
    if unique:
        report.written = store.put_labels(run_id, list(unique.values()), replace=False)
    report.kept = len(unique) - report.written
    return report
