"""Write docs/config_reference.md: every field of the four preference configs, from the dataclasses themselves.

Name, type and default come from ``dataclasses.fields``; the text is ``field_help()``, the same string the
workbench shows as a tooltip and the CLI as help, followed by the allowed values and aliases of the field's
``metadata["choices"]`` and ``["aliases"]``. Fields are grouped by the class that declares them, so a field
shared by all four configs is described once. The Origin column tells CoMLRL's fields from our own keyword-only
ones, and flags CoMLRL fields whose behaviour differs (those named in docs/differences_from_comlrl.md).

    python scripts/gen_config_reference.py           # rewrite the file
    python scripts/gen_config_reference.py --check   # exit 1 if the file is out of date (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from dataclasses import MISSING, Field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "config_reference.md"
DIFFERENCES = ROOT / "docs" / "differences_from_comlrl.md"

sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from comlrl_lab.trainers.preference.config import (  # noqa: E402
    CONFIG_CLASSES,
    MADPOConfig,
    MADPOIterConfig,
    MARLHFConfig,
    MARLHFIterConfig,
    field_aliases,
    field_choices,
)
from comlrl_lab.trainers.preference.config.iterative import _IterativePreferenceConfig  # noqa: E402

# Sections in reading order: the declaring class, its heading, and one sentence on where its fields apply.
SECTIONS: list[tuple[type, str, str]] = [
    (MADPOConfig, "`MADPOConfig`: shared by all four configs", "Every config has these fields."),
    (MARLHFConfig, "`MARLHFConfig`: reward model and online RL", "`MARLHFConfig` and `MARLHFIterConfig` add these."),
    (
        _IterativePreferenceConfig,
        "Iterative configs: rounds, replay buffer and comparator",
        "`MADPOIterConfig` and `MARLHFIterConfig` add these.",
    ),
    (
        MADPOIterConfig,
        "`MADPOIterConfig`: its own defaults",
        "`MADPOIterConfig` declares these again with other defaults or help.",
    ),
    (
        MARLHFIterConfig,
        "`MARLHFIterConfig`: its own defaults and fields",
        "`MARLHFIterConfig` declares these again or adds them.",
    ),
]

ORIGIN_COMLRL = "CoMLRL"
ORIGIN_DIFFERS = "CoMLRL, [differs](differences_from_comlrl.md)"
ORIGIN_OURS = "comlrl-lab"
EMPTY = "''"


def escape(text: str) -> str:
    """Markdown-table-safe text: pipes split cells and ``<word ...>`` would be read as an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def declaring_class(cls: type, name: str) -> type:
    """The first class in ``cls``'s MRO whose body declares ``name``: the one whose default and help apply."""
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            return klass
    raise LookupError(f"{cls.__name__}.{name} has no declaring class")


def default_text(f: Field) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    return f"`{value!r}`"


def fields_named_in_differences(names: set[str]) -> set[str]:
    """Config fields a row of the differences table is about.

    A row is about a field when its Topic, CoMLRL or Opt-in column names it in backticks (as `field` or
    `field=value`); the comlrl-lab column is left out because it also names fields only in passing.
    """
    text = DIFFERENCES.read_text(encoding="utf-8") if DIFFERENCES.is_file() else ""
    quoted: set[str] = set()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 4 or set(cells[0]) <= {"-", ":"} or cells[0] == "Topic":
            continue
        for cell in (cells[0], cells[1], cells[3]):
            quoted.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", cell))
    return names & quoted


def choices_text(owner: type, name: str) -> str:
    """The allowed values and aliases from the field's metadata, or "" for a free field."""
    choices = field_choices(owner, name)
    if not choices:
        return ""
    text = "<br>Choices: " + ", ".join(f"`{c}`" for c in choices) + "."
    aliases = field_aliases(owner, name)
    if aliases:
        # The empty spelling (parallel_training's None) would vanish between backticks.
        text += " Aliases: " + ", ".join(f"`{alias or EMPTY}` -> `{c}`" for alias, c in aliases.items()) + "."
    metadata = owner.__dataclass_fields__[name].metadata
    if metadata.get("suggest"):
        text += " Any other name is an error that suggests the closest spelling."
    elif metadata.get("checked") is False:
        text += " Other names are kept as given (not checked)."
    return text


def origin(f: Field, differing: set[str]) -> str:
    if f.kw_only:
        return ORIGIN_OURS
    return ORIGIN_DIFFERS if f.name in differing else ORIGIN_COMLRL


def section_rows(declarer: type, differing: set[str]) -> list[str]:
    """One table row per field ``declarer`` declares, in declaration order, as the concrete configs see it."""
    # A concrete config that inherits from the declarer gives the field as the declarer defines it.
    owner = next(c for c in CONFIG_CLASSES.values() if declarer in c.__mro__)
    helps = owner.field_help()
    rows = []
    for f in fields(owner):
        if declaring_class(owner, f.name) is not declarer:
            continue
        default = default_text(f)
        parent = next((b for b in declarer.__mro__[1:] if f.name in {g.name for g in _fields_of(b)}), None)
        if parent is not None:
            inherited = next(g for g in _fields_of(parent) if g.name == f.name)
            default += f" (`{parent.__name__}`: {default_text(inherited)})"
        rows.append(
            f"| `{f.name}` | `{escape(str(f.type))}` | {default} | {origin(f, differing)} | "
            f"{escape(helps[f.name])}{choices_text(owner, f.name)} |"
        )
    return rows


def _fields_of(klass: type) -> tuple[Field, ...]:
    try:
        return fields(klass)
    except TypeError:  # not a dataclass (object)
        return ()


def render() -> str:
    all_names = {f.name for cls in CONFIG_CLASSES.values() for f in fields(cls)}
    differing = fields_named_in_differences(all_names)
    counts = ", ".join(f"`{cls.__name__}` {len(fields(cls))}" for cls in CONFIG_CLASSES.values())
    lines = [
        "# Config reference",
        "",
        "<!-- Generated by scripts/gen_config_reference.py from the config dataclasses; do not edit by hand. -->",
        "",
        "Every field of the four preference configs in `comlrl_lab.trainers.preference`, with its type, default",
        'and help text. The help text is each field\'s `metadata["help"]` (`Config.field_help()`), the same text',
        "the workbench shows as a tooltip. Regenerate this page with `python scripts/gen_config_reference.py`;",
        "`tests/test_docs.py` fails when it is out of date.",
        "",
        f"Field counts: {counts}. Fields are listed once, under the class that declares them:",
        "",
        "| Config | Sections that apply |",
        "|---|---|",
    ]
    titles = {declarer: title for declarer, title, _ in SECTIONS}
    for cls in CONFIG_CLASSES.values():
        applying = [titles[d].split(":")[0] for d, _, _ in SECTIONS if d in cls.__mro__]
        lines.append(f"| `{cls.__name__}` | {', '.join(applying)} |")
    lines += [
        "",
        "**Origin**: *CoMLRL* means CoMLRL 1.4.3's name, default and meaning. *CoMLRL, differs* marks a CoMLRL",
        "field whose default or handling we changed; the row in",
        "[differences_from_comlrl.md](differences_from_comlrl.md) says how. *comlrl-lab* marks a field of our own:",
        "it is keyword-only (CoMLRL's positional order is unchanged) and its default keeps CoMLRL's behaviour or",
        "only changes things no result depends on, such as speed.",
        "",
        "All validation runs in `__post_init__` and raises `ConfigError` (a `ValueError` naming its field) with",
        'CoMLRL\'s messages. Name aliases (for example `preference_replay_mode="lambda"`) are resolved to the',
        "canonical value listed here.",
    ]
    for declarer, title, note in SECTIONS:
        lines += [
            "",
            f"## {title}",
            "",
            note,
            "",
            "| Field | Type | Default | Origin | Help |",
            "|---|---|---|---|---|",
            *section_rows(declarer, differing),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config_reference.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.is_file() else None
    if args.check:
        if current != text:
            print("docs/config_reference.md is out of date: python scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    if current != text:
        OUTPUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
