"""Labels in and out of a run's store for outside tools: the comparisons still waiting, and verdicts read back.

``export_waiting`` writes every comparison of the rounds whose label phase has not been committed that has fewer
than ``labels_per_comparison`` labels, blinded as the labelling view shows it (response A and B in the recorded
order), as JSON lines or CSV. Each row names its run (``run_id``) and carries the ``fingerprint`` of the comparison's
texts (``comparison_fingerprint``); ``labeller`` and ``verdict`` hold placeholders to replace, so that a spreadsheet or
a plain ``pandas.read_csv`` reads them as text columns (an empty column would come back as float NaN, which refuses
a name in pandas 3).

``import_labels`` reads such a file back. What would put a label on the wrong comparison refuses the whole file, in
one line and before anything is written (``LabelFileRefused``): a row of another run or with no run named, a row
whose fingerprint is not that of the comparison it names, and a label for a round past its label phase (select only
reads the label phase's verdicts). Other bad rows are named by their line and skipped (only the first
``MAX_REPORTED`` are kept; all are counted): a comparison that does not exist, a round or pair index that is not an
integer, no labeller, a bad verdict, and rows of one labeller for one comparison that disagree (none of them is
written; ``strict`` refuses the file instead). Rows whose verdict is still empty or the placeholder are not labelled
yet and are only counted. A labeller's verdict already in the store is kept (an import never overwrites). The file
is bounded (size and rows), read as UTF-8 with or without a byte-order mark (Excel writes one).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.labels import (
    A_SIDE_KEY,
    Label,
    check_verdict,
    comparison_fingerprint,
    comparison_texts,
    group_labels,
)
from comlrl_lab.store.runstore import RunStore

LABEL_FILE_FORMATS: tuple[str, ...] = ("jsonl", "csv")
MAX_LABEL_FILE_BYTES = 64 * 1024 * 1024
MAX_LABEL_ROWS = 1_000_000
#: Skipped rows named one by one; the rest are only counted.
MAX_REPORTED = 10
COLUMNS = (
    "run_id",
    "round",
    "pair_index",
    "fingerprint",
    "item_index",
    "prompt",
    "response_a",
    "response_b",
    "labeller",
    "verdict",
)
#: What ``labeller`` and ``verdict`` hold until someone fills them in (read back as "not labelled yet").
LABELLER_PLACEHOLDER = "(your name)"
VERDICT_PLACEHOLDER = "(A, B, tie or both_bad)"
#: A round past these phases has read its labels already: a label for it would change nothing.
_PAST_LABELLING = ("label", "select", "train", "evaluate")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class LabelFileRefused(ValueError):
    """The whole labels file is refused (another run's, a label on the wrong comparison, ...); nothing was written."""


@dataclass
class LabelImport:
    """What an import wrote, kept and skipped. ``skipped`` names the first ``MAX_REPORTED`` skipped rows by their
    line; ``skipped_count`` counts them all."""

    written: int = 0
    kept: int = 0  # rows a labeller had already labelled: the stored verdict stays
    unlabelled: int = 0  # rows whose verdict is still empty or the placeholder
    conflicts: int = 0  # (comparison, labeller) with disagreeing rows in the file: none of them written
    skipped: list[str] = field(default_factory=list)
    skipped_count: int = 0

    def skip(self, message: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < MAX_REPORTED:
            self.skipped.append(message)


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
        prompt, response_a, response_b = comparison_texts(pair)
        out.append(
            {
                "run_id": run_id,
                "round": round_index,
                "pair_index": index,
                "fingerprint": comparison_fingerprint(pair),
                "item_index": pair.item_index,
                "prompt": prompt,
                "response_a": response_a,
                "response_b": response_b,
                "labeller": LABELLER_PLACEHOLDER,
                "verdict": VERDICT_PLACEHOLDER,
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


def _read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, row) of every row, read lazily: a row, or the text saying why the line is not one."""
    size = path.stat().st_size
    if size > MAX_LABEL_FILE_BYTES:
        raise LabelFileRefused(f"{path} is {size} bytes, more than a label file may be ({MAX_LABEL_FILE_BYTES})")
    try:
        text = path.read_bytes().decode("utf-8-sig")  # Excel's CSV starts with a byte-order mark
    except UnicodeDecodeError as error:
        raise LabelFileRefused(f"{path} is not UTF-8 text (byte {error.start})") from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(_lines(text))
        rows: Iterator[tuple[int, Any]] = ((reader.line_num, row) for row in reader)
    else:
        rows = _json_lines(text)
    for count, row in enumerate(rows, start=1):
        if count > MAX_LABEL_ROWS:
            raise LabelFileRefused(f"{path} has more rows than a label file may have ({MAX_LABEL_ROWS})")
        yield row


def _lines(text: str) -> Iterator[str]:
    """``text``'s lines, each with its newline, one at a time (``io.StringIO`` would copy the text 4 bytes a
    character, and ``splitlines`` also splits at separators a CSV field may hold)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def _json_lines(text: str) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as error:
            yield number, f"not JSON ({error.msg})"


def _integer(value: Any) -> int:
    """A round or pair index: an integer, or text or a float with an integral value ("3", 3.0); ValueError else
    ("1.9", True, "")."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    number = float(str(value).strip()) if isinstance(value, str) else float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def _shown(value: Any, limit: int = 60) -> str:
    """A value from the file as a message shows it: its repr (control characters escaped), cut to ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _blank(value: Any, placeholder: str) -> bool:
    return value is None or str(value).strip() in ("", placeholder)


def import_labels(store: RunStore, run_id: str, path: str | os.PathLike[str], *, strict: bool = False) -> LabelImport:
    """Read verdicts from a JSONL or CSV file (run_id, round, pair_index, fingerprint, labeller, verdict) into the
    store. Raises ``LabelFileRefused``, having written nothing, for what would mix labels up (see the module
    docstring), and with ``strict`` for any row that would be skipped."""
    path = Path(path)
    comparisons: dict[tuple[int, int], tuple[str, str]] = {}  # (round, pair_index) -> (a_side, fingerprint)
    counters: dict[int, int] = {}
    for pair in store.load_pairs(run_id):
        if A_SIDE_KEY in pair.extra:
            index = counters.get(int(pair.round_index), 0)
            counters[int(pair.round_index)] = index + 1
            comparisons[(int(pair.round_index), index)] = (pair.extra[A_SIDE_KEY], comparison_fingerprint(pair))
    past = {r: phase for r, phase in store.committed_phases(run_id) if phase in _PAST_LABELLING}

    def refuse(where: str, why: str) -> LabelFileRefused:
        return LabelFileRefused(f"{path}: {where}: {why}; nothing was imported")

    report = LabelImport()
    given: dict[tuple[int, int, str], list[tuple[int, str]]] = defaultdict(list)  # -> [(line, verdict)]
    for number, row in _read_rows(path):
        where = f"line {number}"
        if isinstance(row, str) or not isinstance(row, dict):
            report.skip(f"{where}: {row if isinstance(row, str) else 'not an object'}")
            continue
        named = row.get("run_id")
        if named != run_id:
            why = "names no run (no run_id)" if _blank(named, "") else f"is of run {_shown(named)}, not {run_id}"
            raise refuse(where, f"the row {why}; export the labels of this run with `comlrl-lab labels export`")
        try:
            key = (_integer(row.get("round")), _integer(row.get("pair_index")))
        except (TypeError, ValueError):
            report.skip(
                f"{where}: round and pair_index must be integers, got {_shown(row.get('round'))} and "
                f"{_shown(row.get('pair_index'))}"
            )
            continue
        if key not in comparisons:
            report.skip(f"{where}: no comparison round {key[0]} pair {key[1]} in run {run_id}")
            continue
        fingerprint = comparisons[key][1]
        if row.get("fingerprint") != fingerprint:
            raise refuse(
                where,
                f"fingerprint {_shown(row.get('fingerprint'))} is not that of round {key[0]} pair {key[1]} "
                f"({fingerprint}): the row was made for another comparison",
            )
        if _blank(row.get("verdict"), VERDICT_PLACEHOLDER):
            report.unlabelled += 1
            continue
        if key[0] in past:
            raise refuse(
                where,
                f"round {key[0]} is past its label phase ({past[key[0]]} is committed); a label for it would change "
                "nothing",
            )
        labeller = row.get("labeller")
        if _blank(labeller, LABELLER_PLACEHOLDER):
            report.skip(f"{where}: no labeller")
            continue
        labeller = str(labeller).strip()
        if _CONTROL.search(labeller):
            report.skip(f"{where}: labeller {_shown(labeller)} has control characters")
            continue
        try:
            verdict = check_verdict(row.get("verdict"))
        except ValueError:
            report.skip(f"{where}: verdict must be one of A, B, tie, both_bad, got {_shown(row.get('verdict'))}")
            continue
        given[(*key, labeller)].append((number, verdict))
    labels: list[Label] = []
    for (round_index, pair_index, labeller), rows in given.items():
        verdicts = sorted({verdict for _, verdict in rows})
        if len(verdicts) > 1:
            report.conflicts += 1
            lines = ", ".join(str(number) for number, _ in rows)
            report.skip(
                f"lines {lines}: labeller {_shown(labeller)} gives round {round_index} pair {pair_index} "
                f"{' and '.join(verdicts)}; none of them imported"
            )
            continue
        labels.append(Label(round_index, pair_index, labeller, verdicts[0], comparisons[(round_index, pair_index)][0]))
    if strict and report.skipped_count:
        raise LabelFileRefused(
            f"{path}: {report.skipped_count} rows would be skipped (--strict), the first: {report.skipped[0]}; "
            "nothing was imported"
        )
    if labels:
        report.written = store.put_labels(run_id, labels, replace=False)
    report.kept = len(labels) - report.written
    return report
