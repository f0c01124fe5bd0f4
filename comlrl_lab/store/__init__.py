"""The run store: DuckDB schema, one-transaction-per-phase writer, named queries, read-only SQL, export and import.

Only ``engine`` (writes), ``ui`` (reads) and ``cli`` import this package. It never imports torch or streamlit.
Names resolve on first use, so the export formats (``store.formats``) are readable without loading DuckDB.
"""

from __future__ import annotations

from comlrl_lab.lazy_imports import lazy_names

_LAZY = {
    "EXPORT_FORMATS": "formats",
    "PAIR_FORMATS": "formats",
    "ROUND_FILES": "formats",
    "TRL_FILES": "formats",
    "ExportFormat": "formats",
    "export_pairs": "export",
    "export_reward_distribution_files": "export",
    "export_round_files": "export",
    "snapshot_parquet": "export",
    "store_from_snapshot": "export",
    "PAIR_SCHEMA": "dataset_schema",
    "TrlExport": "trl_export",
    "export_trl": "trl_export",
    "ImportRefused": "importer",
    "ImportReport": "importer",
    "import_pair_files": "importer",
    "import_replay_dir": "importer",
    "parse_pair_file": "importer",
    "RunStore": "runstore",
    "PHASES": "schema",
    "SCHEMA_VERSION": "schema",
    "SchemaVersionError": "schema",
    "QueryExecutionError": "sql_guard",
    "ReadOnlyQueryError": "sql_guard",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = sorted(_LAZY)
