"""Writes the built-in tasks' item files, ``data/<task>_{train,eval}.jsonl``, deterministically.

Run ``python -m comlrl_lab.data.tasks.generate`` after changing the word lists; the files are committed, so
the package never generates items at import time. Train and eval items never share a (topic, setting,
stance) combination.
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from pathlib import Path

from comlrl_lab.data.tasks.lexicon import SETTINGS, STANCES, TOPICS

NUM_TRAIN = 240
NUM_EVAL = 60
DATA_DIR = Path(__file__).resolve().parent / "data"


def shared_prompt(item: dict) -> str:
    """``item["prompt"]``: what CoMLRL's default formatter gives every agent when no formatter is set."""
    stance = f" Stance: {item['stance']}." if "stance" in item else ""
    return f"Topic: {item['topic']} {item['setting']}.{stance} Write about {item['topic']}.\nAnswer:"


def make_items(task_name: str) -> dict[str, list[dict]]:
    """Train and eval items of one task, drawn without replacement from every field combination."""
    fields = [TOPICS, SETTINGS] + ([STANCES] if task_name == "stance_agreement" else [])
    combos = list(itertools.product(*fields))
    # A seed from the name, not Python's salted hash(), so every machine writes the same files.
    random.Random(zlib.crc32(task_name.encode())).shuffle(combos)
    splits = {"train": combos[:NUM_TRAIN], "eval": combos[NUM_TRAIN : NUM_TRAIN + NUM_EVAL]}
    out: dict[str, list[dict]] = {}
    for split, chosen in splits.items():
        items = []
        for index, combo in enumerate(chosen):
            item = {"id": f"{task_name}-{split}-{index:04d}", "topic": combo[0], "setting": combo[1]}
            if len(combo) == 3:
                item["stance"] = combo[2]
            item = {"id": item["id"], "prompt": shared_prompt(item), **{k: v for k, v in item.items() if k != "id"}}
            items.append(item)
        out[split] = items
    return out


def main() -> None:
    from comlrl_lab.data.tasks import list_word_tasks

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for name in list_word_tasks():
        for split, items in make_items(name).items():
            path = DATA_DIR / f"{name}_{split}.jsonl"
            path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")
            print(f"wrote {len(items):4d} items to {path}")


if __name__ == "__main__":
    main()
