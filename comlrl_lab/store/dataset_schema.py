"""The columns and types of the pair datasets exports write: one Arrow schema for JSONL, Parquet and CSV, and TRL's.

``PAIR_SCHEMA`` is what a pair export holds in every table format (provenance, the seed's nine fields, the labels and
TRL's joint ``prompt``, ``chosen``, ``rejected``), with every integer int64 and ``labels`` typed even when no
comparison has one; CSV holds the list columns as JSON text (``CSV_SCHEMA``), as CSV has no lists. ``trl_schema``
is the per-agent file of ``export_trl``: TRL's standard form (texts) or its conversational form (messages).
``select_as`` turns a schema into DuckDB casts, so what DuckDB writes is the schema, and ``yaml_features`` into the
``features`` of a Hugging Face dataset card, so ``datasets`` reads a JSONL file with the same types as the Parquet
one. This module holds no SQL but those casts and does not write files.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

#: One label of a comparison, as ``labels`` holds them: who gave it and which verdict (A, B, tie, both_bad).
LABEL_TYPE = pa.struct([("labeller", pa.string()), ("verdict", pa.string())])
#: One chat message of TRL's conversational form.
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])

_TEXTS = pa.list_(pa.string())
_SEED_TYPES: dict[str, pa.DataType] = {
    "prompts": _TEXTS,
    "winner_completions": _TEXTS,
    "loser_completions": _TEXTS,
    "winner_reward": pa.float64(),
    "loser_reward": pa.float64(),
    "candidate_reward_mean": pa.float64(),
    "raw_rewards": pa.list_(pa.float64()),
    "target_raw_reward": pa.float64(),
    "comparator_raw_reward": pa.float64(),
}

# Keyed as queries.PROVENANCE_COLUMNS and data.records.SEED_RECORD_FIELDS name them, in their order (tests check).
_PROVENANCE_TYPES: dict[str, pa.DataType] = {
    "round": pa.int64(),
    "pair_index": pa.int64(),
    "item_index": pa.int64(),
    "winner_candidate_index": pa.int64(),
    "loser_candidate_index": pa.int64(),
    "winner_side": pa.string(),
    "reward_gap": pa.float64(),
}

#: Every pair export in JSONL, Parquet and CSV: provenance, the seed's record, labels, TRL's joint columns.
PAIR_SCHEMA = pa.schema(
    [
        *_PROVENANCE_TYPES.items(),
        *_SEED_TYPES.items(),
        ("labels", pa.list_(LABEL_TYPE)),
        ("prompt", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
    ]
)

#: ``PAIR_SCHEMA`` as CSV holds it: each list column as its JSON text.
CSV_SCHEMA = pa.schema([(f.name, pa.string()) if pa.types.is_list(f.type) else (f.name, f.type) for f in PAIR_SCHEMA])
CSV_JSON_COLUMNS: tuple[str, ...] = tuple(f.name for f in PAIR_SCHEMA if pa.types.is_list(f.type))


def trl_schema(conversational: bool) -> pa.Schema:
    """One agent's TRL file: ``prompt``, ``chosen``, ``rejected`` (texts, or lists of messages), provenance, labels."""
    text = pa.list_(MESSAGE_TYPE) if conversational else pa.string()
    return pa.schema(
        [
            ("prompt", text),
            ("chosen", text),
            ("rejected", text),
            ("round", pa.int64()),
            ("pair_index", pa.int64()),
            ("item_index", pa.int64()),
            ("reward_gap", pa.float64()),
            ("labels", pa.list_(LABEL_TYPE)),
        ]
    )


_DUCKDB_SCALARS = {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN"}


def duckdb_type(arrow_type: pa.DataType) -> str:
    """The DuckDB type DuckDB writes as ``arrow_type`` (the types of these schemas only)."""
    if pa.types.is_list(arrow_type):
        return duckdb_type(arrow_type.value_type) + "[]"
    if pa.types.is_struct(arrow_type):
        fields = ", ".join(
            f"{arrow_type.field(i).name} {duckdb_type(arrow_type.field(i).type)}" for i in range(arrow_type.num_fields)
        )
        return f"STRUCT({fields})"
    return _DUCKDB_SCALARS[arrow_type]


def select_as(schema: pa.Schema, expressions: dict[str, str]) -> str:
    """A SELECT list giving ``schema``'s columns in order, each ``expressions[name]`` (default: the column itself)
    cast to its type."""
    return ", ".join(f"CAST({expressions.get(f.name, f.name)} AS {duckdb_type(f.type)}) AS {f.name}" for f in schema)


_YAML_SCALARS = {pa.int64(): "int64", pa.float64(): "float64", pa.string(): "string", pa.bool_(): "bool"}


def yaml_features(schema: pa.Schema) -> list[dict[str, Any]]:
    """``schema`` as a dataset card's ``dataset_info.features`` (what ``datasets.Features._to_yaml_list`` writes)."""
    return [{"name": f.name, **_yaml_type(f.type)} for f in schema]


def _yaml_type(arrow_type: pa.DataType) -> dict[str, Any]:
    if pa.types.is_list(arrow_type):
        inner = arrow_type.value_type
        return {
            "list": [{"name": f.name, **_yaml_type(f.type)} for f in inner]
            if pa.types.is_struct(inner)
            else _YAML_SCALARS[inner]
        }
    return {"dtype": _YAML_SCALARS[arrow_type]}
