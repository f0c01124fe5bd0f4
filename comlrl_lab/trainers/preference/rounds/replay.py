"""The preference replay buffer D^(ν): round datasets, per-mode weights, seeded sampling of B^(ν), round files.

What it does (reference section 3): every round's pairs are kept in memory with their sampled token ids and
written to ``<replay_dir>/iteration_NNNN.json`` in CoMLRL's format; ``select`` weights the eligible round
datasets by ``preference_replay_mode`` and draws the training sample with the ``random.Random`` handed in.
``state_dict`` carries the whole index and its data, so a checkpoint restores them exactly.

What it does not do: it never reads its own files back to train (the in-memory pairs, token ids included, are
the training data), never imports another run's files into the index, and never overwrites them. It does not
import torch, never calls the global ``random``, and never checks its settings: they come from a validated config
(mode names canonical, k and λ present where the mode needs them), under the config's field names.

A replay mode is its metadata in the config (name, aliases, note, the fields that apply under it) and one entry in
``REPLAY_MODES`` here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from comlrl_lab.data.records import PreferencePair, round_file_payload
from comlrl_lab.names.run_ids import random_hex
from comlrl_lab.trainers.preference.config import MADPOIterConfig, dependents

#: The fields that say how a round's training set is drawn: the mode, and the fields that apply under some modes.
REPLAY_FIELDS: tuple[str, ...] = ("preference_replay_mode", *dependents(MADPOIterConfig, "preference_replay_mode"))
#: File in a replay directory naming the run that owns it.
RUN_MARKER = ".comlrl_lab_run"
STATE_VERSION = 1

_ROUND_FILE = re.compile(r"^iteration_(\d+)\.json$")
_UNSAFE_RUN_ID = re.compile(r"[/\\\x00-\x1f]")  # path separators and control characters (the marker is a line)

T = TypeVar("T")


def lambda_decay_weights(K: int, lam: float) -> list[float]:
    """Weights of K round datasets, **oldest first**: w_a = (1 - λ) λ^a / (1 - λ^K) for age a (0 = newest).

    λ = 1 is uniform (the limit of the formula), λ = 0 keeps only the newest (0^0 = 1).
    K = 3, λ = 0.5 gives [1/7, 2/7, 4/7].
    """
    if isinstance(K, bool) or not isinstance(K, int) or K < 0:
        raise ValueError(f"K must be a non-negative integer, got {K!r}")
    lam = float(lam)
    if K == 0:
        return []
    if lam == 1.0:
        return [1.0 / K] * K
    norm = 1.0 - lam**K  # = Σ_{b<K} (1 - λ) λ^b, closed form
    return [(1.0 - lam) * lam**age / norm for age in range(K - 1, -1, -1)]


Weights = list[tuple[int, float]]


def _equal(rounds: Sequence[int]) -> Weights:
    return [(t, 1.0 / len(rounds)) for t in rounds]


def _this_round(eligible: list[int], current_round: int, settings: Mapping[str, Any]) -> Weights:
    return [(current_round, 1.0)] if current_round in eligible else []


def _nearest_k(eligible: list[int], current_round: int, settings: Mapping[str, Any]) -> Weights:
    return _equal(eligible[-settings["preference_replay_k"] :])


def _all_history(eligible: list[int], current_round: int, settings: Mapping[str, Any]) -> Weights:
    return _equal(eligible)


def _lambda_decay(eligible: list[int], current_round: int, settings: Mapping[str, Any]) -> Weights:
    return list(zip(eligible, lambda_decay_weights(len(eligible), settings["preference_replay_lambda"])))


@dataclass(frozen=True)
class ReplayMode:
    """How one ``preference_replay_mode`` makes B^(ν): ``weights(eligible rounds, this round, settings)`` gives the
    round datasets it uses with their weights, oldest first; ``draws=False`` trains on them as they are instead of
    drawing a sample."""

    weights: Callable[[list[int], int, Mapping[str, Any]], Weights]
    draws: bool = True


#: The one entry per replay mode (reference section 3.1).
REPLAY_MODES: dict[str, ReplayMode] = {
    "current": ReplayMode(_this_round, draws=False),
    "nearest_k": ReplayMode(_nearest_k),
    "all_history": ReplayMode(_all_history),
    "lambda_decay": ReplayMode(_lambda_decay),
}


def replay_weights(
    settings: Mapping[str, Any], datasets_sizes_by_round: Mapping[int, int], *, current_round: int | None = None
) -> Weights:
    """The round datasets the mode of ``settings`` may draw from at ``current_round`` and their weights, oldest first.

    ``settings`` maps the ``REPLAY_FIELDS`` to their values (a validated config's, or a run's stored settings);
    ``datasets_sizes_by_round`` maps 1-based round -> pair count; rounds after ``current_round`` (default: the
    latest round given) are ignored and empty rounds are never eligible.

    * current: this round only, weight 1 (nothing when it has no pairs).
    * nearest_k: the k most recent non-empty rounds, this one included; equal weights whatever their size.
    * all_history: every non-empty round; equal weights.
    * lambda_decay: every non-empty round; ``lambda_decay_weights(K, λ)``.
    """
    if current_round is None:
        current_round = max(datasets_sizes_by_round, default=0)
    eligible = sorted(t for t, n in datasets_sizes_by_round.items() if t <= current_round and n > 0)
    return REPLAY_MODES[settings["preference_replay_mode"]].weights(eligible, current_round, settings)


def default_sample_size(sample_size: int | None, current_count: int, latest_nonempty_count: int | None) -> int:
    """S: ``preference_replay_sample_size`` if set, else this round's pair count, else the latest non-empty
    round's count, else 0 (reference 3.3)."""
    if sample_size is not None:
        return int(sample_size)
    if current_count > 0:
        return int(current_count)
    return int(latest_nonempty_count or 0)


def draw_replay_sample(
    datasets: Mapping[int, Sequence[T]],
    weights: Mapping[int, float],
    sample_size: int,
    rng: random.Random,
) -> tuple[list[T], dict[int, int]]:
    """Draw ``sample_size`` items across weighted datasets; returns (shuffled sample, count drawn per round).

    Each draw picks a dataset by weight (one multinomial of S draws). Within a dataset a count c <= n is a
    sample without replacement; c > n appends whole shuffled copies while the remainder is >= n, then a
    without-replacement sample of the remainder, so every item appears floor(c/n) or ceil(c/n) times.
    """
    rounds = [t for t in sorted(weights) if len(datasets.get(t, ())) > 0]
    drawn = {t: 0 for t in rounds}
    if sample_size <= 0 or not rounds or not math.fsum(weights[t] for t in rounds) > 0:
        return [], drawn
    for t in rng.choices(rounds, weights=[weights[t] for t in rounds], k=sample_size):
        drawn[t] += 1
    sample: list[T] = []
    for t in rounds:
        data, count = list(datasets[t]), drawn[t]
        if count <= len(data):
            sample.extend(rng.sample(data, count))
            continue
        remaining = count
        while remaining >= len(data):
            cycle = list(data)
            rng.shuffle(cycle)
            sample.extend(cycle)
            remaining -= len(data)
        if remaining:
            sample.extend(rng.sample(data, remaining))
    rng.shuffle(sample)
    return sample, drawn


@dataclass
class ReplaySelection:
    """B^(ν): the training pairs of one round, the weight of each eligible round and how many it gave."""

    pairs: list[PreferencePair]
    weights: dict[int, float] = field(default_factory=dict)
    drawn: dict[int, int] = field(default_factory=dict)

    @property
    def sample_size(self) -> int:
        return len(self.pairs)


class ReplayBuffer:
    """Round datasets of one run, kept in memory (with token ids) and mirrored to ``iteration_NNNN.json`` files.

    ``replay_dir=None`` keeps everything in memory. Otherwise the buffer claims the directory for ``run_id``
    with a ``.comlrl_lab_run`` marker. A directory that already holds another run's files (another marker, or
    round files and no marker, such as CoMLRL output) is left untouched and the buffer writes to its
    ``run-<run_id>`` subdirectory instead; the path in use is ``self.replay_dir``. The same run id resumes in
    place. Pairs handed out by ``select`` are shared with the buffer: do not mutate them.

    ``write_files=False`` (data-parallel ranks other than the main one) keeps the same index and draws the same
    samples but never touches the directory: ``replay_dir`` is then None.
    """

    def __init__(
        self,
        config: Any,
        replay_dir: str | os.PathLike[str] | None = None,
        num_agents: int | None = None,
        *,
        run_id: str | None = None,
        write_files: bool = True,
    ):
        #: The config's replay fields, under their names (``REPLAY_FIELDS``).
        self.settings: dict[str, Any] = {name: getattr(config, name) for name in REPLAY_FIELDS}
        self.num_agents = num_agents
        self.run_id = run_id if run_id is not None else random_hex(12)
        _check_run_id(self.run_id)
        self.write_files = bool(write_files)
        self._requested_dir = replay_dir if self.write_files else None
        self.replay_dir: Path | None = (
            None if self._requested_dir is None else claim_run_directory(self._requested_dir, self.run_id)
        )
        self._rounds: dict[int, list[PreferencePair]] = {}

    # ----------------------------------------------------------------------------------------------- index
    @property
    def round_sizes(self) -> dict[int, int]:
        """1-based round -> pair count, every recorded round (empty ones included), oldest first."""
        return {t: len(self._rounds[t]) for t in sorted(self._rounds)}

    def round_pairs(self, iteration: int) -> list[PreferencePair]:
        return list(self._rounds.get(iteration, []))

    def weights(self, iteration: int) -> list[tuple[int, float]]:
        """The eligible rounds at ``iteration`` and their weights under this buffer's mode."""
        sizes = {t: n for t, n in self.round_sizes.items() if t <= iteration}
        return replay_weights(self.settings, sizes, current_round=iteration)

    def add_round(self, iteration: int, pairs: Sequence[PreferencePair]) -> Path | None:
        """Record round ``iteration``'s pairs (an empty round is recorded but never eligible) and write its file.

        Adding a round again replaces it (a resumed run redoing the round). Returns the file path, if any.
        """
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 1:
            raise ValueError(f"iteration must be a positive (1-based) integer, got {iteration!r}")
        self._rounds[iteration] = list(pairs)
        if self.replay_dir is None:
            return None
        return write_round_file(self.replay_dir, iteration, self._rounds[iteration])

    # ------------------------------------------------------------------------------------------- sampling
    def select(self, iteration: int, rng: random.Random) -> ReplaySelection:
        """Draw B^(ν) for round ``iteration`` (reference 3.2-3.3).

        A mode that does not draw ("current") returns its datasets' pairs as they are (no sampling, no shuffle).
        The others draw S pairs (``default_sample_size``) across the eligible rounds with ``rng``; S = 0 or no
        eligible round gives an empty selection.
        """
        weights = dict(self.weights(iteration))
        if not REPLAY_MODES[self.settings["preference_replay_mode"]].draws:
            pairs = [pair for t in weights for pair in self._rounds[t]]
            return ReplaySelection(pairs, weights, {t: len(self._rounds[t]) for t in weights})
        sizes = self.round_sizes
        latest = [n for t, n in sizes.items() if t <= iteration and n > 0]
        size = default_sample_size(
            self.settings["preference_replay_sample_size"], sizes.get(iteration, 0), latest[-1] if latest else None
        )
        pairs, drawn = draw_replay_sample(self._rounds, weights, size, rng)
        return ReplaySelection(pairs, weights, drawn)

    # -------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: settings, run id, directory and every round's pairs (records, provenance, token ids)."""
        return {
            "version": STATE_VERSION,
            "settings": dict(self.settings),
            "num_agents": self.num_agents,
            "run_id": self.run_id,
            "replay_dir": None if self.replay_dir is None else str(self.replay_dir),
            "rounds": [
                {"iteration": t, "pairs": [dataclasses.asdict(p) for p in self._rounds[t]]}
                for t in sorted(self._rounds)
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the index and its pairs exactly. Settings stay as constructed (they come from the config).

        The checkpoint's run id is adopted: a buffer built with a fresh id gives up its still-empty directory
        claim and continues in the checkpointed run's directory. Round files missing there are written again;
        existing files are left as they are.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported replay buffer state version {state.get('version')!r}")
        rounds: dict[int, list[PreferencePair]] = {}
        for entry in state["rounds"]:
            rounds[int(entry["iteration"])] = [_pair_from_state(p) for p in entry["pairs"]]
        run_id = state.get("run_id")
        if run_id is not None and run_id != self.run_id:
            _check_run_id(run_id)
            self._release_claim()
            self.run_id = run_id
            if self._requested_dir is not None:
                self.replay_dir = claim_run_directory(self._requested_dir, run_id)
        self._rounds = rounds
        if self.replay_dir is not None:
            for t, pairs in rounds.items():
                if not (self.replay_dir / round_file_name(t)).exists():
                    write_round_file(self.replay_dir, t, pairs)

    def _release_claim(self) -> None:
        """Drop this buffer's marker (and its directory, when left empty) if it wrote no round file there."""
        directory = self.replay_dir
        if directory is None or _read_marker(directory) != self.run_id or _has_round_files(directory):
            return
        (directory / RUN_MARKER).unlink()
        with contextlib.suppress(OSError):  # not empty: it holds someone's other files; leave it
            directory.rmdir()


# ------------------------------------------------------------------------------------------------ round files
def round_file_name(iteration: int) -> str:
    return f"iteration_{iteration:04d}.json"


def round_file_bytes(iteration: int, pairs: Sequence[PreferencePair]) -> bytes:
    """CoMLRL's shard format: one unindented JSON object, non-ASCII kept, UTF-8, no trailing newline."""
    return json.dumps(round_file_payload(iteration, list(pairs)), ensure_ascii=False).encode("utf-8")


def write_round_file(directory: str | os.PathLike[str], iteration: int, pairs: Sequence[PreferencePair]) -> Path:
    """Write ``iteration_NNNN.json`` atomically (temporary file, fsync, ``os.replace``)."""
    path = Path(directory) / round_file_name(iteration)
    _atomic_write(path, round_file_bytes(iteration, pairs))
    return path


# ------------------------------------------------------------------------------------------- run directories
def claim_run_directory(directory: str | os.PathLike[str], run_id: str) -> Path:
    """The directory run ``run_id`` writes its round files to; never one that holds another run's files.

    ``directory`` itself when it is ours already (resume) or holds no round files and no marker; otherwise its
    ``run-<run_id>`` subdirectory. The marker is created with O_EXCL, so two runs cannot claim one directory.
    """
    # Differs from CoMLRL: a new run never overwrites another run's iteration files (its section 8.26).
    _check_run_id(run_id)
    base = Path(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    for candidate in (base, base / f"run-{run_id}"):
        owner = _read_marker(candidate)
        if owner == run_id:
            return candidate
        if owner is None and not _has_round_files(candidate):
            candidate.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(candidate / RUN_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if _read_marker(candidate) == run_id:
                    return candidate
                continue  # another run claimed it in the meantime
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(run_id + "\n")
            return candidate
    raise FileExistsError(
        f"preference_replay_dir {base} and its subdirectory run-{run_id} both hold another run's files; "
        "choose another preference_replay_dir"
    )


def drop_round_files(directory: str | os.PathLike[str], run_id: str, keep: Callable[[int], bool]) -> list[Path]:
    """Remove run ``run_id``'s round files whose round ``keep`` rejects; return the paths removed.

    A round file is written during its collect phase, before the phase is committed: a kill in between leaves a
    file for a round the run never finished. Only directories marked as this run's are touched.
    """
    base = Path(os.path.abspath(os.path.expanduser(os.fspath(directory))))
    removed = []
    for candidate in (base, base / f"run-{run_id}"):
        if not candidate.is_dir() or _read_marker(candidate) != run_id:
            continue
        for entry in sorted(candidate.iterdir()):
            found = _ROUND_FILE.match(entry.name)
            if found and not keep(int(found.group(1))):
                entry.unlink()
                removed.append(entry)
    return removed


def _read_marker(directory: Path) -> str | None:
    try:
        return (directory / RUN_MARKER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except NotADirectoryError as exc:
        raise ValueError(f"preference_replay_dir {directory} is not a directory") from exc


def _has_round_files(directory: Path) -> bool:
    if not directory.is_dir():
        if directory.exists():
            raise ValueError(f"preference_replay_dir {directory} is not a directory")
        return False
    return any(_ROUND_FILE.match(entry.name) for entry in directory.iterdir())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _pair_from_state(state: Mapping[str, Any]) -> PreferencePair:
    names = {f.name for f in dataclasses.fields(PreferencePair)}
    unknown = set(state) - names
    if unknown:
        raise ValueError(f"replay buffer state has unknown pair fields: {sorted(unknown)}")
    return PreferencePair(**state)


def _check_run_id(run_id: str) -> None:
    # The id names a subdirectory, run-<run_id>, so it must stay one path component.
    if not isinstance(run_id, str) or not run_id.strip() or run_id.startswith(".") or _UNSAFE_RUN_ID.search(run_id):
        raise ValueError(
            f"run_id must be a non-empty name without path separators or control characters, got {run_id!r}"
        )
