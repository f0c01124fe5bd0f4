"""Rebuilds the embedded tiny model, ``comlrl_lab/models/tiny/``: corpus, tokenizer, a small Llama, saved offline.

    python scripts/train_tiny_lm.py                 # the shipped model (5 to 8 minutes on one CPU core)
    python scripts/train_tiny_lm.py --steps 50 --out /tmp/tiny   # a quick smoke build

Everything is seeded and runs on one thread, so the same torch version rebuilds the same weights. The
corpus comes from ``tiny_corpus.py``; the model is a ``LlamaForCausalLM`` with tied embeddings and a
byte-level BPE tokenizer whose pad token differs from EOS. This script does not touch the task item files.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_corpus import corpus_examples  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "comlrl_lab" / "models" / "tiny"
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes, nothing maps to <unk>) that prepends <s> like Llama's tokenizers."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        # Batched generation in a decoder-only model needs the prompts flush right.
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def encode_examples(tokenizer: PreTrainedTokenizerFast, examples: list[tuple[str, str]]) -> list[list[int]]:
    """<s> prompt answer </s> per example, tokenised as one string, as generation will see it."""
    texts = [f"{prompt} {answer}" for prompt, answer in examples]
    return [ids + [tokenizer.eos_token_id] for ids in tokenizer(texts)["input_ids"]]


def batches(sequences: list[list[int]], batch_size: int, pad_id: int, rng: random.Random):
    """Endless padded batches; examples of similar length go together so little compute goes to padding."""
    order = sorted(range(len(sequences)), key=lambda i: (len(sequences[i]), i))
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    while True:
        rng.shuffle(chunks)
        for chunk in chunks:
            width = max(len(sequences[i]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # (B, T)
            for row, i in enumerate(chunk):
                ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            mask = (ids != pad_id).long()
            labels = ids.masked_fill(mask == 0, -100)
            yield ids, mask, labels


def train(model: LlamaForCausalLM, sequences: list[list[int]], pad_id: int, args: argparse.Namespace) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        # Linear warm-up, then cosine down to a tenth of the peak.
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    stream = batches(sequences, args.batch_size, pad_id, random.Random(args.seed))
    model.train()
    start, running = time.time(), None
    for step in range(args.steps):
        ids, mask, labels = next(stream)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.time() - start
            print(f"step {step:5d}/{args.steps}  loss {running:.3f}  {elapsed:6.0f}s", flush=True)
    model.eval()


def show_samples(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, prompts: list[str]) -> None:
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, do_sample=True, temperature=1.0, max_new_tokens=48)
    for prompt, row in zip(prompts, out[:, batch["input_ids"].shape[1] :]):
        print(repr(prompt), "->", repr(tokenizer.decode(row, skip_special_tokens=True)))
    torch.random.set_rng_state(generator_state)


def portable_tokenizer_class(config_path: Path) -> None:
    """Name the generic fast tokenizer class, which transformers 4.x and 5.x both resolve.

    transformers 5 writes its own "TokenizersBackend", which 4.x cannot load; 5.x maps the old name to it.
    """
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--examples", type=int, default=60_000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args(argv)

    # One thread: the build must not depend on the core count, and other work shares the machine.
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    began = time.time()

    examples = corpus_examples(args.examples, seed=args.seed)
    tokenizer = build_tokenizer([f"{p} {a}" for p, a in examples], args.vocab_size)
    sequences = encode_examples(tokenizer, examples)
    model = build_model(tokenizer, args)
    num_tokens = sum(len(s) for s in sequences)
    print(
        f"corpus: {len(examples)} examples, {num_tokens} tokens; vocab {len(tokenizer)}; "
        f"model {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters"
    )

    train(model, sequences, tokenizer.pad_token_id, args)

    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    portable_tokenizer_class(args.out / "tokenizer_config.json")
    print(f"saved to {args.out} after {time.time() - began:.0f}s")
    show_samples(model, tokenizer, [p for p, _ in examples[:6]])


if __name__ == "__main__":
    main()
