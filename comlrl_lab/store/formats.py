"""The export formats by name: what the Data page calls each, its file suffix and MIME type.

Kept apart from ``export`` (which needs DuckDB) so that the command line can offer the formats without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportFormat:
    """One way to export a run: what the Data page calls it, the suffix of the file it makes, that file's MIME type."""

    label: str
    suffix: str
    mime: str


#: Every export format, in the order the Data page and ``comlrl-lab export --format`` offer them.
EXPORT_FORMATS: dict[str, ExportFormat] = {
    "json": ExportFormat("Seed JSON (one list of records)", ".json", "application/json"),
    "jsonl": ExportFormat("JSONL (one record per line)", ".jsonl", "application/jsonl"),
    "parquet": ExportFormat("Parquet (records + provenance)", ".parquet", "application/vnd.apache.parquet"),
    "csv": ExportFormat("CSV (records + provenance)", ".csv", "text/csv"),
    "rounds": ExportFormat("Iteration files (iteration_NNNN.json, zipped)", ".zip", "application/zip"),
    "trl": ExportFormat("TRL pairs, one file per agent, with dataset card (zipped)", ".zip", "application/zip"),
}
#: CoMLRL's iteration_NNNN.json files, one per round: a folder (``export_round_files``), zipped by the workbench.
ROUND_FILES = "rounds"
#: TRL's preference datasets, one file per agent and a dataset card: a folder (``export_trl``), zipped by the workbench.
TRL_FILES = "trl"
#: The formats that write a folder rather than one file of pairs.
FOLDER_FORMATS: tuple[str, ...] = (ROUND_FILES, TRL_FILES)
#: The formats ``export_pairs`` writes: one file of pairs.
PAIR_FORMATS = tuple(name for name in EXPORT_FORMATS if name not in FOLDER_FORMATS)
#: The pair formats that get a dataset card beside them (the seed's JSON stays the seed's records alone).
CARD_FORMATS = tuple(name for name in PAIR_FORMATS if name != "json")
#: The file formats of ``export_trl``'s per-agent files (``--as``).
TRL_FILE_FORMATS: tuple[str, ...] = ("jsonl", "parquet")
#: How a TRL export writes an actor's prompts (``--prompt-form``): "auto" as messages where its chat template rendered
#: them (its tokenizer is loaded to tell), "standard" always as texts (nothing is loaded).
TRL_PROMPT_FORMS: tuple[str, ...] = ("auto", "standard")
