"""Whether a model on this machine is whole, checked before any work: its folder's files or its ``.gguf`` file.

A model folder (the embedded model, a registered name, a path) needs a readable ``config.json``, weights whose
headers are whole and whose data is all there (safetensors: the header's byte ranges fit the file; ``.bin``: a
readable zip archive; an index: every shard it names), and, when it has them, tokenizer files that parse. A
``.gguf`` file is parsed with the ``gguf`` package, which reads every tensor's place in the file. A file deleted,
truncated or damaged is named in one line (``ModelLoadError``), where the libraries would fail later with pages of
their own messages, or not at all until the weights are read. This module reads headers only, never weights.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

#: A safetensors header above this is no header: the file is damaged (the format itself caps it at 100 MB).
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


class DamagedModel(OSError):
    """A model's files are missing, truncated or damaged; the message names the file and what is wrong."""


def check_model_files(path: str | os.PathLike) -> None:
    """Raise ``DamagedModel`` naming the first file of the model at ``path`` (a folder or a ``.gguf`` file) that is
    missing, truncated or damaged; return quietly for a whole model, and for a path that is neither (a hub id)."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        _check_gguf(path)
    elif path.is_dir() and not (path / "adapter_config.json").is_file():  # a LoRA adapter folder is loaded elsewhere
        _check_folder(path)


def _check_folder(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise DamagedModel(f"{folder} has no config.json")
    for name in _JSON_FILES:
        if (folder / name).is_file():
            _read_json(folder / name)
    weights = _weight_files(folder)
    if not weights:
        raise DamagedModel(f"{folder} has no weights ({' or '.join(_WEIGHT_FILES)}, or a sharded index)")
    for file in weights:
        if not file.is_file():
            raise DamagedModel(f"{file} is missing (its index names it)")
        if file.suffix == ".safetensors":
            _check_safetensors(file)
        elif file.suffix == ".bin":
            _check_zip(file)


def _read_json(file: Path) -> object:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise DamagedModel(f"{file} is not valid JSON (truncated or damaged: {_first_line(error)})") from None


def _weight_files(folder: Path) -> list[Path]:
    for index in _WEIGHT_INDEXES:
        if (folder / index).is_file():
            data = _read_json(folder / index)
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise DamagedModel(f"{folder / index} has no weight_map")
            return [folder / name for name in sorted(set(map(str, weight_map.values())))]
    return [folder / name for name in _WEIGHT_FILES if (folder / name).is_file()]


def _check_safetensors(file: Path) -> None:
    """The header's length, its JSON, and every tensor's byte range within the data that follows it."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise DamagedModel(f"{file} is truncated ({size} bytes: not even a safetensors header)")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_SAFETENSORS_HEADER or 8 + length > size:
            raise DamagedModel(f"{file} is truncated or damaged (its header claims {length} bytes of {size})")
        try:
            header = json.loads(handle.read(length).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise DamagedModel(f"{file} has a damaged header ({_first_line(error)})") from None
    data = size - 8 - length
    if not isinstance(header, dict):
        raise DamagedModel(f"{file} has a damaged header (not a JSON object)")
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets") or ()) == 2
    ]
    needed = max(ends, default=0)
    if not isinstance(needed, int) or needed > data:
        raise DamagedModel(f"{file} is truncated: its tensors need {needed} bytes of data, the file holds {data}")


def _check_zip(file: Path) -> None:
    try:
        with zipfile.ZipFile(file) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        raise DamagedModel(f"{file} is truncated or damaged (not a readable archive: {_first_line(error)})") from None


def _check_gguf(file: Path) -> None:
    try:
        import gguf
    except ImportError:  # transformers needs it to read the file at all; loading says so
        return
    try:
        reader = gguf.GGUFReader(str(file))
        for tensor in reader.tensors:
            if tensor.data.size != tensor.n_elements and tensor.data.nbytes != tensor.n_bytes:
                raise ValueError(f"tensor {tensor.name} is cut short")
    except Exception as error:  # the reader fails in many ways on a cut file: IndexError, ValueError, struct.error
        raise DamagedModel(f"{file} is not a whole GGUF file (truncated or damaged: {_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:160]
