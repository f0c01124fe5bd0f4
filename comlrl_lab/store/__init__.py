"""The run store: DuckDB schema, one-transaction-per-phase writer, named queries, read-only SQL, export and import.

Only ``engine`` (writes), ``ui`` (reads) and ``cli`` import this package. It never imports torch or streamlit.
"""

from comlrl_lab.store.export import (
    EXPORT_FORMATS,
    PAIR_FORMATS,
    ROUND_FILES,
    ExportFormat,
    export_pairs,
    export_reward_distribution_files,
    export_round_files,
    snapshot_parquet,
)
from comlrl_lab.store.importer import ImportRefused, ImportReport, import_pair_files, import_replay_dir, parse_pair_file
from comlrl_lab.store.runstore import RunStore
from comlrl_lab.store.schema import PHASES, SCHEMA_VERSION, SchemaVersionError
from comlrl_lab.store.sql_guard import QueryExecutionError, ReadOnlyQueryError

__all__ = [
    "EXPORT_FORMATS",
    "PAIR_FORMATS",
    "PHASES",
    "ROUND_FILES",
    "SCHEMA_VERSION",
    "ExportFormat",
    "ImportRefused",
    "ImportReport",
    "QueryExecutionError",
    "ReadOnlyQueryError",
    "RunStore",
    "SchemaVersionError",
    "export_pairs",
    "export_reward_distribution_files",
    "export_round_files",
    "import_pair_files",
    "import_replay_dir",
    "parse_pair_file",
    "snapshot_parquet",
]
