"""Load agent models and tokenizers: the embedded tiny model, a registered name, a folder, a ``.gguf`` file or a hub id.

``load_agents`` follows the argument semantics and runtime messages of CoMLRL's trainer constructors
(agent_model / agents / tokenizer / model_config), and returns an ``AgentBundle``. Hub ids are looked up in
the local cache first; the network is tried only when it answers, so a machine without network fails fast
with ``ModelLoadError`` instead of waiting on timeouts. A registered name (``comlrl-lab models add``) is its
folder in the models folder; a ``.gguf`` file is dequantised on every load (``gguf.py``), which registering
it once avoids. This module does not generate, score or train.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import threading
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from comlrl_lab.models.devices import resolve_devices, resolve_dtype
from comlrl_lab.models.gguf import is_gguf_file, load_gguf
from comlrl_lab.models.model_files import DamagedModel, check_model_files
from comlrl_lab.models.registry import RegistryError, check_model_name, registered_path
from comlrl_lab.models.tiny_model import is_tiny_model_name, tiny_model_path

DEFAULT_ATTN_IMPLEMENTATION = "sdpa"
HUB_PROBE_TIMEOUT_S = 3.0
_MODEL_CONFIG_KEYS = {"torch_dtype", "dtype", "attn_implementation", "model_kwargs", "special_tokens"}
# Keys CoMLRL's model_config also carries that other parts of the trainers read.
_MODEL_CONFIG_OTHER_KEYS = {"critic_model_kwargs"}
# from_pretrained arguments in model_kwargs that the tokenizer needs too.
_HUB_KWARGS = ("cache_dir", "revision", "token", "trust_remote_code")


class ModelLoadError(OSError):
    """A model or tokenizer could not be found locally and could not be fetched."""


@dataclass
class AgentBundle:
    """The loaded agents: one model, tokenizer, source and device per agent (tokenizers may be shared)."""

    models: list[Any]
    tokenizers: list[Any]
    sources: list[str | None]  # the name or path each model came from; None for model objects
    devices: list[torch.device]

    @property
    def num_agents(self) -> int:
        return len(self.models)


# Sources --------------------------------------------------------------------------------------------------


def resolve_model_source(source: str) -> str:
    """The folder of the embedded model's names and of registered names; any other string unchanged (a path, a
    ``.gguf`` file or a hub id). A bare name meant for the registry but not in it raises ``ModelLoadError``."""
    if is_tiny_model_name(source):
        path = tiny_model_path()
        if not os.path.isdir(path):
            raise ModelLoadError(f"the embedded model {source!r} is missing: {path} does not exist.")
        return path
    path = os.path.expanduser(source)
    if os.path.exists(path):
        return path
    registered = registered_path(source)
    if registered is not None:
        return str(registered)
    try:
        check_model_name(source)
    except RegistryError as exc:
        raise ModelLoadError(str(exc)) from None
    return path


def local_source(source: str) -> str | None:
    """The folder or ``.gguf`` file ``source`` names on this machine (the embedded model, a registered name, a path,
    a hub id in the local Hugging Face cache); None for a path that does not exist or a hub id that is not cached,
    which only the network could tell more about. Never touches the network."""
    path = resolve_model_source(source.strip())
    if os.path.isdir(path) or is_gguf_file(path):
        return path
    return None if _looks_like_path(path) else _cached_snapshot(path, {})


def _looks_like_path(source: str) -> bool:
    return os.path.isabs(source) or source.startswith((".", "~"))


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except (ImportError, AttributeError):
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _hub_offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except (ImportError, AttributeError):
        return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (or the HTTPS proxy in front of it) opens within ``timeout`` s.

    Runs in a daemon thread so that a slow DNS resolver cannot stretch the wait past ``timeout``.
    """
    url = urllib.parse.urlsplit(_hub_endpoint())
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or host, proxy_url.port or 3128
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True, name="comlrl-lab-hub-probe")
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _cached_snapshot(repo_id: str, kwargs: Mapping[str, Any]) -> str | None:
    """The local snapshot directory of a hub repo in the Hugging Face cache, without any network access.

    transformers' own ``local_files_only=True`` still sends requests on some paths (5.x looks for an adapter
    config online and retries for ~20 s without network), so the cache is resolved here and the directory
    is handed to ``from_pretrained`` instead of the id.
    """
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            repo_id, revision=kwargs.get("revision"), cache_dir=kwargs.get("cache_dir"), local_files_only=True
        )
    except (OSError, ValueError):  # not cached, or not a valid repo id
        return None


def _keep_hub_name(loaded: Any, repo_id: str) -> None:
    """Name a model or tokenizer loaded from a cache directory after its hub id, as loading by id would."""
    config = getattr(loaded, "config", None)
    if config is not None:
        config._name_or_path = repo_id
    with contextlib.suppress(AttributeError):
        loaded.name_or_path = repo_id


#: Held around every ``from_pretrained`` of this process. transformers builds a model under a context that patches
#: ``nn.Module`` globally (parameters on the meta device); two threads in it at once can restore each other's patch,
#: after which every later load in the process fails with "Cannot copy out of meta tensor" (seen with two runs of a
#: sweep in one server, one loading its history comparator while the other loaded its agents).
LOAD_LOCK = threading.RLock()


def load_pretrained(loader: Callable[..., Any], source: str, what: str = "model", **kwargs: Any) -> Any:
    """``loader(source, **kwargs)`` for the embedded model, a directory, or a hub id (local cache first).

    ``loader`` is any ``from_pretrained`` (model, tokenizer, config); ``what`` names it in error messages. Loads
    in one process run one at a time (``LOAD_LOCK``).
    """
    with LOAD_LOCK:
        return _load_pretrained(loader, source, what, **kwargs)


def _load_pretrained(loader: Callable[..., Any], source: str, what: str, **kwargs: Any) -> Any:
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{what} source must be a non-empty string (a name, a directory or a hub id), got {source!r}.")
    path = resolve_model_source(source.strip())
    if os.path.isdir(path):
        return loader(path, **kwargs)
    if is_gguf_file(path):
        return load_gguf(loader, path, **kwargs)
    if _looks_like_path(path):
        raise ModelLoadError(f"{what} directory {source!r} does not exist.")
    local_reason: Exception | None = None
    snapshot = _cached_snapshot(path, kwargs)
    if snapshot is not None:
        try:
            loaded = loader(snapshot, **kwargs)
        except OSError as exc:  # a partial download: let the hub fill the gaps when it can
            local_reason = exc
        else:
            _keep_hub_name(loaded, path)
            return loaded
    problem = _offline_problem(source, what)
    if problem is not None:
        raise ModelLoadError(problem) from local_reason
    try:
        return loader(path, **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"{what} {source!r} could not be loaded from {_hub_endpoint()}: {exc}") from exc


def _offline_problem(source: str, what: str) -> str | None:
    """Why a hub id that is not in the cache cannot be fetched now (the hub is offline or out of reach), or None."""
    if _hub_offline():
        return (
            f"{what} {source!r} was not found locally (not a directory, not in the Hugging Face cache) and the hub is "
            f"offline (HF_HUB_OFFLINE is set). Download it on a machine with network or pass a local directory."
        )
    if not hub_reachable():
        return (
            f"{what} {source!r} was not found locally (not a directory, not in the Hugging Face cache) and no network "
            f"is available: {_hub_endpoint()} cannot be reached (offline). Pass a local directory, pre-download the "
            f"model into the cache, or use the embedded model 'comlrl-lab/tiny'."
        )
    return None


def check_model_whole(source: str) -> None:
    """``ModelLoadError`` in one line, before any work, when the folder or ``.gguf`` file ``source`` names here is
    missing files, truncated or damaged (``model_files``); a hub id not on this machine passes."""
    name = source.strip()
    path = resolve_model_source(name)
    try:
        check_model_files(path)
    except DamagedModel as damaged:
        if registered_path(name) is not None:
            remedy = f"register it again: comlrl-lab models add {name} --force"
        else:
            remedy = "copy or download the model again"
        raise ModelLoadError(f"model {name!r}: {damaged}; {remedy}") from None


def check_available(source: str, what: str = "model") -> None:
    """``ModelLoadError`` now, before any work, for a hub id that is neither a folder nor in the Hugging Face cache
    while the hub is offline or out of reach; loading would fail the same way later."""
    path = resolve_model_source(source.strip())
    if os.path.isdir(path) or _looks_like_path(path) or _cached_snapshot(path, {}) is not None:
        return
    problem = _offline_problem(source, what)
    if problem is not None:
        raise ModelLoadError(problem)


# Tokenizers -----------------------------------------------------------------------------------------------


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token if it has none: its EOS token, as CoMLRL does (with a warning)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer
    if tokenizer.eos_token is None:
        raise ValueError(
            f"Tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a pad token nor an EOS token; "
            "set tokenizer.pad_token before training."
        )
    warnings.warn(
        f"Tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no pad token; using its EOS token "
        f"{tokenizer.eos_token!r} for padding, as CoMLRL does. The final token is then ambiguous: padding and the "
        "EOS that ended a response share one id. Give the tokenizer a distinct pad token to avoid this.",
        UserWarning,
        stacklevel=2,
    )
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(source: str, *, special_tokens: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """An ``AutoTokenizer`` for ``source``, with a pad token (``ensure_pad_token``) and any ``special_tokens``."""
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, source, "tokenizer", **kwargs)
    if special_tokens:
        tokenizer.add_special_tokens(dict(special_tokens))
    return ensure_pad_token(tokenizer)


# Models ---------------------------------------------------------------------------------------------------


def dtype_keyword() -> str:
    """The name of ``from_pretrained``'s dtype argument in the installed transformers."""
    import transformers
    from packaging.version import Version

    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype (the old name still works, with a warning).
    return "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


def load_model(
    source: str,
    *,
    device: torch.device | str,
    dtype: Any = None,
    model_kwargs: Mapping[str, Any] | None = None,
    attn_implementation: str | None = DEFAULT_ATTN_IMPLEMENTATION,
) -> Any:
    """Load a causal LM from ``source`` onto ``device``.

    ``dtype`` is resolved with ``resolve_dtype`` (None / "auto": bf16 on a capable GPU, fp32 otherwise).
    ``attn_implementation`` defaults to "sdpa", as in CoMLRL; when the model does not support it, the
    transformers default is used instead. ``model_kwargs`` go to ``from_pretrained`` and win over both.
    """
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    if isinstance(source, str) and source.strip():
        check_model_whole(source)  # one line for a damaged folder or file, not the libraries' pages
    kwargs: dict[str, Any] = {dtype_keyword(): resolve_dtype(dtype, device)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    kwargs.update(dict(model_kwargs or {}))
    try:
        model = load_pretrained(AutoModelForCausalLM.from_pretrained, source, "model", **kwargs)
    except (ValueError, ImportError) as exc:
        asked = kwargs.get("attn_implementation")
        if asked != DEFAULT_ATTN_IMPLEMENTATION or "sdpa" not in str(exc).lower():
            raise
        kwargs.pop("attn_implementation")
        model = load_pretrained(AutoModelForCausalLM.from_pretrained, source, "model", **kwargs)
    return model.to(device)


def load_once(sources: Sequence[Any], devices: Sequence[Any], load: Callable[[str, Any], Any]) -> list[Any]:
    """One model per source: ``load(source, device)`` once for each distinct string source; each later use of the
    same source gets a deep copy of that first model (its own trainable weights), moved to its own device.

    Reading and converting the files again costs about three times a copy (the tiny model: 150 ms against 50 ms).
    Objects are returned as they are. The copies are made from the loaded model before any caller changes it.
    """
    first: dict[str, Any] = {}
    models = []
    for source, device in zip(sources, devices):
        if not isinstance(source, str):
            models.append(source)
        elif source in first:
            models.append(copy.deepcopy(first[source]).to(device))
        else:
            first[source] = load(source, device)
            models.append(first[source])
    return models


def _model_options(model_config: Mapping[str, Any] | None) -> dict[str, Any]:
    config = dict(model_config or {})
    unknown = set(config) - _MODEL_CONFIG_KEYS - _MODEL_CONFIG_OTHER_KEYS
    if unknown:
        warnings.warn(f"model_config: ignoring unknown keys {sorted(unknown)}", UserWarning, stacklevel=3)
    if "dtype" in config and "torch_dtype" in config and config["dtype"] != config["torch_dtype"]:
        raise ValueError(
            f"model_config: dtype={config['dtype']!r} and torch_dtype={config['torch_dtype']!r} disagree; give one."
        )
    model_kwargs = config.get("model_kwargs") or {}
    if not isinstance(model_kwargs, Mapping):
        raise ValueError(f"model_config['model_kwargs'] must be a dict, got {type(model_kwargs).__name__}.")
    special_tokens = config.get("special_tokens") or {}
    if not isinstance(special_tokens, Mapping):
        raise ValueError(f"model_config['special_tokens'] must be a dict, got {type(special_tokens).__name__}.")
    return {
        "dtype": config.get("dtype", config.get("torch_dtype")),
        "attn_implementation": config.get("attn_implementation", DEFAULT_ATTN_IMPLEMENTATION),
        "model_kwargs": dict(model_kwargs),
        "special_tokens": dict(special_tokens),
    }


def _agent_sources(agent_model: Any, agents: Any, num_agents: int) -> list[Any]:
    if agent_model is None and agents is None:
        raise ValueError("Either agent_model or agents must be provided.")
    if agents is None:
        if not isinstance(agent_model, str):
            raise ValueError("agent_model should be a string to create homogeneous agents")
        if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
            raise ValueError(f"num_agents must be a positive integer, got {num_agents!r}.")
        return [agent_model] * num_agents
    if isinstance(agents, (str, bytes)) or not isinstance(agents, Sequence) or len(agents) == 0:
        raise ValueError("agents must be a non-empty list of model names or model objects.")
    agents = list(agents)
    if agent_model is not None and not (
        isinstance(agent_model, str) and all(isinstance(a, str) and a == agent_model for a in agents)
    ):
        raise ValueError(
            "When both agent_model and agents are given, agents must be a list of names equal to agent_model "
            f"(got agent_model={agent_model!r})."
        )
    return agents


def _agent_tokenizers(
    tokenizer: Any, sources: list[Any], special_tokens: dict[str, Any], hub_kwargs: dict[str, Any]
) -> list[Any]:
    count = len(sources)
    if tokenizer is None:
        if not all(isinstance(s, str) for s in sources):
            raise ValueError("Tokenizer(s) must be provided when agents are model objects.")
        by_source: dict[str, Any] = {}  # agents loaded from the same source share one tokenizer object
        for source in sources:
            if source not in by_source:
                by_source[source] = load_tokenizer(source, special_tokens=special_tokens, **hub_kwargs)
        return [by_source[s] for s in sources]
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != count:
            raise ValueError(
                f"A list of tokenizers must have one per agent: got {len(tokenizer)} tokenizers for {count} agents."
            )
        tokenizers = list(tokenizer)
    else:
        tokenizers = [tokenizer] * count
    seen: set[int] = set()
    for tok in tokenizers:
        if id(tok) not in seen:
            seen.add(id(tok))
            if special_tokens:
                tok.add_special_tokens(dict(special_tokens))
            ensure_pad_token(tok)
    return tokenizers


def hub_options(model_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``from_pretrained`` options in ``model_config["model_kwargs"]`` that say where the files come from
    (cache_dir, revision, token, trust_remote_code): the tokenizer is loaded with them as the weights are."""
    return {k: v for k, v in (model_kwargs or {}).items() if k in _HUB_KWARGS}


def _fit_embeddings(model: Any, tokenizer: Any) -> None:
    """Grow the input embeddings when added special tokens made the vocabulary larger than the model's."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and len(tokenizer) > embeddings.num_embeddings:
        model.resize_token_embeddings(len(tokenizer))


def load_agents(
    agent_model: Any = None,
    agents: Sequence[Any] | None = None,
    num_agents: int = 2,
    tokenizer: Any = None,
    model_config: Mapping[str, Any] | None = None,
    devices: Any = None,
) -> AgentBundle:
    """Build the agents the way CoMLRL's trainer constructors do.

    - ``agent_model`` (a name, path or hub id): ``num_agents`` homogeneous agents, loaded once and copied
      (``load_once``): each has its own weights.
    - ``agents``: a list of names or model objects; the agent count is ``len(agents)``. Objects need
      ``tokenizer``. With both, ``agents`` must be names equal to ``agent_model``.
    - ``tokenizer``: one tokenizer shared by all agents or a list with one per agent; None loads one per
      distinct source. A missing pad token becomes the EOS token (with a warning).
    - ``model_config``: ``dtype``/``torch_dtype``, ``attn_implementation`` (default "sdpa"),
      ``model_kwargs`` (to ``from_pretrained``), ``special_tokens`` (added to the tokenizers; embeddings grow
      to fit). Model objects keep their dtype.
    - ``devices``: an ``agent_devices`` spec (see ``resolve_devices``); model objects are moved there.
    """
    sources = _agent_sources(agent_model, agents, num_agents)
    options = _model_options(model_config)
    agent_devices = resolve_devices(devices, len(sources), field_name="agent_devices")
    # Where the weights come from is where the tokenizer comes from.
    hub_kwargs = hub_options(options["model_kwargs"])
    tokenizers = _agent_tokenizers(tokenizer, sources, options["special_tokens"], hub_kwargs)
    models = load_once(
        sources,
        agent_devices,
        lambda source, device: load_model(
            source,
            device=device,
            dtype=options["dtype"],
            model_kwargs=options["model_kwargs"],
            attn_implementation=options["attn_implementation"],
        ),
    )
    models = [model.to(device) for model, device in zip(models, agent_devices)]
    if options["special_tokens"]:
        for model, tok in zip(models, tokenizers):
            _fit_embeddings(model, tok)
    return AgentBundle(
        models=models,
        tokenizers=tokenizers,
        sources=[s if isinstance(s, str) else None for s in sources],
        devices=agent_devices,
    )


# Older private names, used by modules written before these were public.
_from_pretrained = load_pretrained
_dtype_keyword = dtype_keyword
