"""comlrl_lab.models: device specs, loading (CoMLRL constructor semantics), batched sampling and scoring."""

from __future__ import annotations

import shutil
import time
import warnings

import pytest
import torch
from model_fixtures import EOS, PAD, build_model, build_tiny_model_dir, build_tokenizer, embedded_tiny_model_dir

from comlrl_lab.models import devices as devices_mod
from comlrl_lab.models import loading
from comlrl_lab.models.devices import resolve_devices, resolve_dtype
from comlrl_lab.models.generation import SampledText, SamplingSettings, count_tokens, sample_candidates
from comlrl_lab.models.loading import (
    AgentBundle,
    ModelLoadError,
    ensure_pad_token,
    load_agents,
    load_model,
    load_tokenizer,
)
from comlrl_lab.models.scoring import disable_dropout, sequence_logps, token_logps_and_mask

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(len(tokenizer))


def cuda(i):
    return torch.device("cuda", i)


# devices ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [None, "auto", " AUTO "])
def test_auto_devices_cpu_one_gpu_and_four_gpus(spec):
    assert resolve_devices(spec, 3, cuda_count=0) == [CPU] * 3
    assert resolve_devices(spec, 3, cuda_count=1) == [cuda(0)] * 3
    assert resolve_devices(spec, 2, cuda_count=4) == [cuda(0), cuda(1)]
    assert resolve_devices(spec, 4, cuda_count=4) == [cuda(i) for i in range(4)]
    # Fewer GPUs than agents: round-robin over the GPUs there are.
    assert resolve_devices(spec, 3, cuda_count=2) == [cuda(0), cuda(1), cuda(0)]


def test_explicit_device_specs():
    assert resolve_devices("cpu", 2, cuda_count=0) == [CPU, CPU]
    assert resolve_devices(torch.device("cpu"), 2, cuda_count=0) == [CPU, CPU]
    assert resolve_devices(["cpu"], 3, cuda_count=0) == [CPU] * 3
    assert resolve_devices(["cuda:1", "cuda:3"], 2, cuda_count=4) == [cuda(1), cuda(3)]
    assert resolve_devices(("cpu", "cuda:0"), 2, cuda_count=1) == [CPU, cuda(0)]
    assert resolve_devices("cuda:2", 2, cuda_count=4) == [cuda(2), cuda(2)]


@pytest.mark.parametrize(
    "spec, count, cuda_count, match",
    [
        (["cpu", "cpu"], 3, 0, "reference_devices must have length 1 or 3"),
        (42.0, 2, 0, "reference_devices must be None"),
        ({"a": "cpu"}, 2, 0, "reference_devices must be None"),
        ("gpu0", 2, 0, "reference_devices: 'gpu0' is not a valid device"),
        (["cpu", 3.5], 2, 0, "reference_devices: each device must be a string"),
        ("cuda:1", 2, 1, "only 1 are available"),
        ("cuda", 2, 0, "no CUDA device is available"),
        ("cpu", 0, 0, "reference_devices: the number of models must be a positive integer"),
    ],
)
def test_bad_device_specs_name_the_field(spec, count, cuda_count, match):
    with pytest.raises(ValueError, match=match):
        resolve_devices(spec, count, field_name="reference_devices", cuda_count=cuda_count)


def test_default_field_name_and_real_cuda_count():
    with pytest.raises(ValueError, match="^agent_devices"):
        resolve_devices(["cpu", "cpu", "cpu"], 2)
    expected = [cuda(0), cuda(1)] if torch.cuda.device_count() >= 2 else None
    if torch.cuda.device_count() == 0:
        expected = [CPU, CPU]
    if expected is not None:
        assert resolve_devices(None, 2) == expected


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype(None, CPU) == torch.float32
    assert resolve_dtype("auto", "cuda:0", bf16_ok=True) == torch.bfloat16
    assert resolve_dtype("auto", "cuda:0", bf16_ok=False) == torch.float32
    for name, dtype in [
        ("bf16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("float16", torch.float16),
        ("float32", torch.float32),
        ("torch.float32", torch.float32),
        ("FP32", torch.float32),
    ]:
        assert resolve_dtype(name, CPU) == dtype
    assert resolve_dtype(torch.float16, CPU) == torch.float16
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_dtype("int8", CPU)
    assert devices_mod.bf16_supported(CPU) is False


# loading ---------------------------------------------------------------------------------------------------


def test_load_model_and_tokenizer_from_a_directory(model_dir):
    tok = load_tokenizer(str(model_dir))
    assert tok.pad_token == PAD and tok.eos_token == EOS and tok.pad_token_id != tok.eos_token_id
    model = load_model(str(model_dir), device="cpu")
    assert model.dtype == torch.float32 and model.device == CPU
    assert model.config._attn_implementation == "sdpa"
    bf16 = load_model(str(model_dir), device=CPU, dtype="bf16", attn_implementation="eager")
    assert bf16.dtype == torch.bfloat16 and bf16.config._attn_implementation == "eager"


def test_missing_local_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"), device="cpu")
    with pytest.raises(ValueError, match="non-empty string"):
        load_tokenizer("")


def test_missing_embedded_model_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "tiny_model_path", lambda: str(tmp_path / "tiny"))
    with pytest.raises(ModelLoadError, match="embedded model 'comlrl-lab/tiny' is missing"):
        load_tokenizer("comlrl-lab/tiny")


def test_unknown_hub_id_without_network_fails_fast(monkeypatch):
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=loading.HUB_PROBE_TIMEOUT_S: False)
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="no network") as info:
        load_tokenizer("nonexistent-org/nonexistent-model")
    assert "offline" in str(info.value) and "not found locally" in str(info.value)
    with pytest.raises(OSError):  # ModelLoadError is an OSError, as transformers' own loading errors are
        load_model("nonexistent-org/nonexistent-model", device="cpu")
    assert time.monotonic() - start < 10


def test_unknown_hub_id_fails_within_seconds_whatever_the_network():
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="nonexistent-org/nonexistent-model"):
        load_tokenizer("nonexistent-org/nonexistent-model")
    assert time.monotonic() - start < 15
    start = time.monotonic()
    loading.hub_reachable(timeout=0.5)
    assert time.monotonic() - start < 2


def test_hub_id_found_in_the_local_cache_loads_without_network(model_dir, tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the network must not be probed for a cached model")

    monkeypatch.setattr(loading, "hub_reachable", no_network)
    repo = tmp_path / "cache" / "models--some-org--some-model"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    cache_dir = str(tmp_path / "cache")
    model = load_model("some-org/some-model", device="cpu", model_kwargs={"cache_dir": cache_dir})
    assert model.config._name_or_path == "some-org/some-model"
    tok = load_tokenizer("some-org/some-model", cache_dir=cache_dir)
    assert tok.name_or_path == "some-org/some-model" and tok.pad_token == PAD
    # load_agents hands the cache location in model_kwargs to the tokenizer too.
    bundle = load_agents("some-org/some-model", num_agents=1, model_config={"model_kwargs": {"cache_dir": cache_dir}})
    assert bundle.sources == ["some-org/some-model"] and bundle.tokenizers[0].pad_token == PAD


def test_load_agents_homogeneous(model_dir):
    bundle = load_agents(str(model_dir), num_agents=3, devices="cpu")
    assert isinstance(bundle, AgentBundle) and bundle.num_agents == 3
    assert bundle.sources == [str(model_dir)] * 3 and bundle.devices == [CPU] * 3
    assert len({id(m) for m in bundle.models}) == 3  # separate copies ...
    first = dict(bundle.models[0].named_parameters())
    for other in bundle.models[1:]:  # ... of the same weights
        assert all(torch.equal(first[n], p) for n, p in other.named_parameters())
    assert bundle.tokenizers[0] is bundle.tokenizers[2]  # one tokenizer per distinct source


def test_load_agents_reads_each_source_once_and_copies_it_into_independent_weights(model_dir, monkeypatch):
    reads = []
    read = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda source, **kw: reads.append(source) or read(source, **kw))
    other = str(model_dir) + "/."  # a second spelling of the folder: another source, read on its own
    bundle = load_agents(agents=[str(model_dir), other, str(model_dir), str(model_dir)], devices="cpu")
    assert reads == [str(model_dir), other]
    first, copy = bundle.models[0], bundle.models[2]
    assert copy is not first and copy.config is not first.config
    with torch.no_grad():
        next(copy.parameters()).add_(1.0)  # training one agent leaves the others as loaded
    assert torch.equal(next(first.parameters()), next(bundle.models[3].parameters()))
    assert not torch.equal(next(first.parameters()), next(copy.parameters()))
    # Tied weights stay tied within each copy, and are not shared between copies.
    embeddings, head = copy.get_input_embeddings().weight, copy.get_output_embeddings().weight
    assert (embeddings is head) == (first.get_input_embeddings().weight is first.get_output_embeddings().weight)
    assert embeddings.data_ptr() != first.get_input_embeddings().weight.data_ptr()


def test_load_agents_names_equal_to_agent_model_and_model_config(model_dir):
    bundle = load_agents(
        str(model_dir),
        agents=[str(model_dir)] * 2,
        model_config={
            "torch_dtype": "bfloat16",
            "attn_implementation": "eager",
            "special_tokens": {"additional_special_tokens": ["<extra>"]},
        },
    )
    assert bundle.num_agents == 2
    tok = bundle.tokenizers[0]
    assert "<extra>" in tok.get_vocab()
    for m in bundle.models:
        assert m.dtype == torch.bfloat16 and m.config._attn_implementation == "eager"
        assert m.get_input_embeddings().num_embeddings >= len(tok)


def test_load_agents_objects_need_tokenizers_and_move_to_devices(model, tokenizer):
    with pytest.raises(ValueError, match=r"^Tokenizer\(s\) must be provided when agents are model objects\.$"):
        load_agents(agents=[model, model])
    bundle = load_agents(agents=[model, model], tokenizer=[tokenizer, tokenizer], devices=["cpu"])
    assert bundle.sources == [None, None] and bundle.devices == [CPU, CPU]
    assert bundle.models[0] is model and bundle.tokenizers == [tokenizer, tokenizer]
    with pytest.raises(ValueError, match="one per agent: got 3 tokenizers for 2 agents"):
        load_agents(agents=[model, model], tokenizer=[tokenizer] * 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, r"^Either agent_model or agents must be provided\.$"),
        ({"agent_model": object()}, r"^agent_model should be a string to create homogeneous agents$"),
        ({"agent_model": "x", "agents": ["x", "y"]}, "agents must be a list of names equal to agent_model"),
        ({"agent_model": "x", "num_agents": 0}, "num_agents must be a positive integer"),
        ({"agents": []}, "non-empty list"),
        ({"agent_model": "x", "devices": ["cpu"] * 3}, "agent_devices must have length 1 or 2"),
        ({"agent_model": "x", "model_config": {"dtype": "bf16", "torch_dtype": "fp32"}}, "disagree"),
    ],
)
def test_load_agents_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_agents(**kwargs)


def test_missing_pad_token_falls_back_to_eos_with_a_warning(model, tmp_path):
    tok = build_tokenizer(with_pad=False)
    assert tok.pad_token_id is None
    with pytest.warns(UserWarning, match="ambiguous"):
        bundle = load_agents(agents=[model], tokenizer=tok)
    assert bundle.tokenizers[0].pad_token_id == bundle.tokenizers[0].eos_token_id
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ensure_pad_token(tok)  # already has one now: no second warning
    path = build_tiny_model_dir(tmp_path / "nopad", with_pad=False)
    with pytest.warns(UserWarning, match="no pad token"):
        assert load_tokenizer(str(path)).pad_token == EOS


# generation ------------------------------------------------------------------------------------------------

PROMPTS = ["the cat", "one two three four five", "red", "big dog up"]
SETTINGS = SamplingSettings(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, batch_size=5)


def _gen(seed, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


def test_sampling_settings_validation():
    assert SamplingSettings().max_new_tokens == 256 and SamplingSettings().top_k == 50
    for bad in [{"max_new_tokens": 0}, {"temperature": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"batch_size": 0}]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingSettings(**bad)


def test_sample_candidates_shapes_eos_cut_and_text(model, tokenizer):
    out = sample_candidates(model, tokenizer, PROMPTS, 5, SETTINGS, _gen(0))
    assert len(out) == len(PROMPTS) and all(len(row) == 5 for row in out)
    eos = tokenizer.eos_token_id
    finished = 0
    for prompt, row in zip(PROMPTS, out):
        for s in row:
            assert isinstance(s, SampledText)
            assert s.prompt_ids == tokenizer(prompt)["input_ids"]
            assert s.text == tokenizer.decode(s.completion_ids, skip_special_tokens=True)
            if s.finished:
                finished += 1
                assert s.completion_ids[-1] == eos and eos not in s.completion_ids[:-1]
            else:
                assert len(s.completion_ids) == SETTINGS.max_new_tokens and eos not in s.completion_ids
    assert count_tokens(out) == sum(len(s.completion_ids) for row in out for s in row)
    assert 0 < count_tokens(out) <= 20 * SETTINGS.max_new_tokens


def test_finished_sequences_are_unpadded(model, tokenizer):
    # Make EOS likely, so the batch mixes finished (padded by generate) and running sequences.
    biased = build_model(len(tokenizer))
    with torch.no_grad():
        biased.lm_head.weight[tokenizer.eos_token_id] *= 0
        biased.lm_head.weight[tokenizer.eos_token_id] += biased.lm_head.weight.mean(0)
    settings = SamplingSettings(max_new_tokens=12, temperature=3.0, top_p=1.0, top_k=None, batch_size=16)
    out = [s for row in sample_candidates(biased, tokenizer, PROMPTS, 4, settings, _gen(1)) for s in row]
    lengths = {len(s.completion_ids) for s in out if s.finished}
    assert lengths and min(lengths) < settings.max_new_tokens
    for s in out:
        if s.finished:
            assert s.completion_ids.index(tokenizer.eos_token_id) == len(s.completion_ids) - 1


def test_same_generator_state_same_samples(model, tokenizer):
    a = sample_candidates(model, tokenizer, PROMPTS, 3, SETTINGS, _gen(7))
    b = sample_candidates(model, tokenizer, PROMPTS, 3, SETTINGS, _gen(7))
    c = sample_candidates(model, tokenizer, PROMPTS, 3, SETTINGS, _gen(8))
    assert a == b
    assert a != c


def test_generator_drives_generate_exactly(model, tokenizer):
    """The sampler with generator seed s equals raw generate after torch.manual_seed(s) on the same batch."""
    settings = SamplingSettings(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=None, batch_size=4)
    ours = sample_candidates(model, tokenizer, ["the cat"], 4, settings, _gen(123))[0]
    ids = torch.tensor([tokenizer("the cat")["input_ids"]] * 4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        raw = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            num_beams=1,
            max_new_tokens=5,
            temperature=1.0,
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    for s, row in zip(ours, raw[:, ids.shape[1] :].tolist()):
        assert s.completion_ids == row[: len(s.completion_ids)]


def test_streams_are_isolated_and_global_rng_untouched(model, tokenizer):
    global_before = torch.get_rng_state()
    train = _gen(1)
    first = sample_candidates(model, tokenizer, PROMPTS, 2, SETTINGS, train)
    second = sample_candidates(model, tokenizer, PROMPTS, 2, SETTINGS, train)
    assert first != second  # the generator advanced

    train = _gen(1)
    assert sample_candidates(model, tokenizer, PROMPTS, 2, SETTINGS, train) == first
    sample_candidates(model, tokenizer, PROMPTS, 3, SETTINGS, _gen(99))  # comparator stream in between
    torch.rand(5)  # and someone else using the global RNG
    assert sample_candidates(model, tokenizer, PROMPTS, 2, SETTINGS, train) == second
    torch.set_rng_state(global_before)
    sample_candidates(model, tokenizer, PROMPTS, 2, SETTINGS, _gen(5))
    assert torch.equal(torch.get_rng_state(), global_before)


def test_mode_restored_and_edge_cases(model, tokenizer):
    model.train()
    try:
        sample_candidates(model, tokenizer, PROMPTS[:1], 1, SETTINGS, _gen(0))
        assert model.training
    finally:
        model.eval()
    assert sample_candidates(model, tokenizer, PROMPTS, 0, SETTINGS, _gen(0)) == [[], [], [], []]
    assert sample_candidates(model, tokenizer, [], 3, SETTINGS, _gen(0)) == []
    with pytest.raises(ValueError, match="num_return_sequences"):
        sample_candidates(
            model, tokenizer, PROMPTS, 1, SETTINGS, _gen(0), extra_generate_kwargs={"num_return_sequences": 2}
        )
    # do_sample is dropped (generation always samples); other kwargs reach generate.
    out = sample_candidates(
        model, tokenizer, PROMPTS, 2, SETTINGS, _gen(0), extra_generate_kwargs={"do_sample": False, "min_new_tokens": 6}
    )
    assert all(len(s.completion_ids) == 6 for row in out for s in row)


def test_pad_equal_to_eos_tokenizer(model):
    tok = build_tokenizer(with_pad=False)
    with pytest.warns(UserWarning):
        ensure_pad_token(tok)
    out = sample_candidates(model, tok, PROMPTS, 3, SETTINGS, _gen(2))
    for s in (s for row in out for s in row):
        assert tok.eos_token_id not in s.completion_ids[:-1]


# scoring ---------------------------------------------------------------------------------------------------


def reference_logp(model, prompt, completion, score_final_token):
    """Batch-1 forward of prompt ++ completion and an explicit log-softmax sum (float64)."""
    n = len(completion) if score_final_token else max(len(completion) - 1, 0)
    if n == 0:
        return 0.0
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    return sum(float(logp[len(prompt) - 1 + t, completion[t]]) for t in range(n))


PROMPT_IDS = [[2, 4, 19], [2, 6, 7, 8, 9, 10], [2], [2, 16, 17], [2, 5], [2, 30, 31, 32, 33]]
COMPLETION_IDS = [[22, 4, 1], [5], [], [0, 7, 0, 9, 11, 12, 1], [13, 14], [20, 21, 22, 23, 24, 25, 26, 27, 28]]


@pytest.mark.parametrize("score_final_token", [False, True])
@pytest.mark.parametrize("micro_batch_size", [1, 2, 16])
def test_sequence_logps_match_a_hand_computed_reference(model, score_final_token, micro_batch_size):
    expected = [reference_logp(model, p, c, score_final_token) for p, c in zip(PROMPT_IDS, COMPLETION_IDS)]
    with torch.no_grad():
        got = sequence_logps(
            model,
            PROMPT_IDS,
            COMPLETION_IDS,
            pad_token_id=0,
            score_final_token=score_final_token,
            micro_batch_size=micro_batch_size,
        )
    assert got.dtype == torch.float32 and got.shape == (len(PROMPT_IDS),)
    assert got.tolist() == pytest.approx(expected, abs=1e-4)
    # Empty completions score 0; a single token scores 0 only when the final token is dropped.
    assert got[2].item() == 0.0
    assert (got[1].item() == 0.0) is (not score_final_token)


def test_final_token_convention_differs_by_exactly_the_last_token(model):
    with torch.no_grad():
        dropped = sequence_logps(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0)
        full, token_logps, mask = sequence_logps(
            model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0, score_final_token=True, return_token_logps=True
        )
    lengths = [len(c) for c in COMPLETION_IDS]
    assert mask.sum(-1).tolist() == lengths
    for b, n in enumerate(lengths):
        last = token_logps[b, n - 1].item() if n else 0.0
        assert full[b].item() - dropped[b].item() == pytest.approx(last, abs=1e-5)


def test_padding_and_batch_composition_do_not_change_scores(model):
    with torch.no_grad():
        alone = [
            sequence_logps(model, [p], [c], pad_token_id=0, score_final_token=True).item()
            for p, c in zip(PROMPT_IDS, COMPLETION_IDS)
        ]
        batched = sequence_logps(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0, score_final_token=True)
        other_pad = sequence_logps(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=17, score_final_token=True)
    assert batched.tolist() == pytest.approx(alone, abs=1e-5)
    assert other_pad.tolist() == pytest.approx(alone, abs=1e-5)

    # A left-padded batch with matching position ids gives the same numbers.
    seqs = [p + c for p, c in zip(PROMPT_IDS, COMPLETION_IDS)]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float(), -1)
    left = []
    for b, (p, c) in enumerate(zip(PROMPT_IDS, COMPLETION_IDS)):
        start = width - len(p) - len(c)
        left.append(sum(logp[b, start + len(p) - 1 + t, c[t]].item() for t in range(len(c))))
    assert batched.tolist() == pytest.approx(left, abs=1e-4)


def test_gradients_flow_and_no_grad_detaches(tokenizer):
    model = build_model(len(tokenizer), seed=3)
    logps = sequence_logps(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0, micro_batch_size=2)
    assert logps.requires_grad
    logps.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    # Only the scored tokens' logits get gradient: the embedding of a token that appears nowhere stays zero.
    seen = {t for s in PROMPT_IDS + COMPLETION_IDS for t in s}
    unseen = next(t for t in range(len(tokenizer)) if t not in seen)
    assert model.get_input_embeddings().weight.grad[unseen].abs().sum() == 0
    with torch.no_grad():
        assert not sequence_logps(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0).requires_grad


def test_nothing_to_score_gives_zeros_that_backward_accepts(model):
    logps = sequence_logps(model, [[2, 4], [2]], [[], [7]], pad_token_id=0)
    assert logps.tolist() == [0.0, 0.0] and logps.requires_grad
    logps.sum().backward()
    empty = sequence_logps(model, [], [], pad_token_id=0)
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match="prompt_ids\\[0\\] is empty"):
        sequence_logps(model, [[]], [[4, 5]], pad_token_id=0)
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        sequence_logps(model, [[2], [2]], [[4]], pad_token_id=0)


def test_token_logps_and_mask_cover_every_real_token(model):
    with torch.no_grad():
        token_logps, mask = token_logps_and_mask(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0, micro_batch_size=4)
        full = sequence_logps(model, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0, score_final_token=True)
    assert token_logps.shape == mask.shape == (len(PROMPT_IDS), max(map(len, COMPLETION_IDS)))
    assert mask.sum(-1).tolist() == [len(c) for c in COMPLETION_IDS]
    assert (token_logps[~mask] == 0).all() and (token_logps[mask] < 0).all()
    assert token_logps.sum(-1).tolist() == pytest.approx(full.tolist(), abs=1e-6)
    expected = reference_logp(model, PROMPT_IDS[3], COMPLETION_IDS[3][:2], True)
    assert token_logps[3, :2].sum().item() == pytest.approx(expected, abs=1e-4)


def test_bf16_model_scores_in_float32(model):
    bf16 = build_model(model.config.vocab_size).to(torch.bfloat16)
    with torch.no_grad():
        got = sequence_logps(bf16, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0)
    assert got.dtype == torch.float32
    assert torch.isfinite(got).all()


def test_disable_dropout_makes_train_mode_scoring_deterministic(tokenizer):
    noisy = build_model(len(tokenizer), dropout=0.5).train()
    with torch.no_grad():
        a = sequence_logps(noisy, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0)
        b = sequence_logps(noisy, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0)
        assert not torch.allclose(a, b)
        disable_dropout(noisy)
        assert noisy.training
        a = sequence_logps(noisy, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0)
        b = sequence_logps(noisy, PROMPT_IDS, COMPLETION_IDS, pad_token_id=0)
    assert torch.equal(a, b)


# the embedded tiny model -----------------------------------------------------------------------------------


@pytest.mark.skipif(embedded_tiny_model_dir() is None, reason="the embedded tiny model has not been built yet")
def test_embedded_tiny_model_loads_samples_and_scores():
    from comlrl_lab.models import TINY_MODEL_NAME

    bundle = load_agents(TINY_MODEL_NAME, num_agents=2, devices="cpu")
    assert bundle.sources == [TINY_MODEL_NAME] * 2
    tok = bundle.tokenizers[0]
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert load_model("tiny", device="cpu").config.vocab_size == bundle.models[0].config.vocab_size
    settings = SamplingSettings(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None, batch_size=8)
    out = sample_candidates(bundle.models[0], tok, ["Write a short sentence.", "Hi"], 3, settings, _gen(0))
    flat = [s for row in out for s in row]
    assert all(0 < len(s.completion_ids) <= 8 for s in flat)
    with torch.no_grad():
        logps = sequence_logps(
            bundle.models[0],
            [s.prompt_ids for s in flat],
            [s.completion_ids for s in flat],
            pad_token_id=tok.pad_token_id,
            score_final_token=True,
        )
        expected = [reference_logp(bundle.models[0], s.prompt_ids, s.completion_ids, True) for s in flat]
    assert logps.tolist() == pytest.approx(expected, abs=1e-3)


def test_every_from_pretrained_holds_the_process_wide_load_lock(tmp_path):
    """While one thread loads, no other thread can take the lock, so two loads never overlap."""
    import threading

    seen: list[bool] = []

    def loader(path, **kwargs):
        other: list[bool] = []
        probe = threading.Thread(target=lambda: other.append(loading.LOAD_LOCK.acquire(blocking=False)))
        probe.start()
        probe.join()
        seen.append(other[0])
        return path

    assert loading.load_pretrained(loader, str(tmp_path)) == str(tmp_path)
    assert seen == [False]
    assert loading.LOAD_LOCK.acquire(blocking=False)  # released afterwards
    loading.LOAD_LOCK.release()
