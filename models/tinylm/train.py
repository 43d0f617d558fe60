"""Train tinylm: a ~1M-parameter Llama-style language model of Python source, on the CPU, in a few minutes.

Builds the corpus (``corpus.py``: the standard library's own ``.py`` files), trains a byte-level BPE tokenizer
(``tokenizers``, vocabulary 1024) and a ``LlamaForCausalLM`` (RoPE, grouped-query attention, RMSNorm, SiLU MLP),
then writes a standard Hugging Face model directory to ``model/`` and the run's numbers to ``metrics.json``. The
held-out perplexity is measured on the committed ``heldout.txt`` with the saved model (``load.perplexity``).

    HF_HUB_OFFLINE=1 .venv/bin/python models/tinylm/train.py            # defaults: the committed model
    HF_HUB_OFFLINE=1 .venv/bin/python models/tinylm/train.py --steps 50 --out-dir /tmp/tinylm   # a quick try
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch loads OpenMP: idle threads sleep instead of spinning. On a shared 2-core machine spinning threads made
# a step 6x slower (2.4 s instead of 0.4 s at batch 16).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_mod  # beside this file
import load

HERE = Path(__file__).resolve().parent
EOT = "<|endoftext|>"
VOCAB_SIZE = 1024
CONTEXT = 128
SEED = 0


def model_config(vocab_size: int, eot_id: int) -> LlamaConfig:
    # Every MatMul's input dimension (128, 384) is a multiple of 32, so INT4 block quantization with block 32 works.
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        initializer_range=0.02,
        use_cache=True,
    )


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))  # cosine down to 10 % of the peak


def _portable(model_dir: Path) -> None:
    """Make the saved files readable by older tools too (transformers 4.x, optimum, onnxruntime-genai).

    transformers 5 writes ``tokenizer_class: TokenizersBackend``, no ``special_tokens_map.json`` and the RoPE base
    only inside ``rope_parameters``; 4.x knows none of these. ``PreTrainedTokenizerFast`` (loads tokenizer.json as
    is) and a top-level ``rope_theta`` mean the same to both.
    """
    tc_path = model_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    special = {k: tc[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in tc}
    (model_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", cfg.get("dtype", "float32"))
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=HERE, help="where model/ and metrics.json go")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    started = time.perf_counter()

    corpus = corpus_mod.build()
    texts = [d.text for d in corpus.train]
    print(f"corpus: Python {corpus.python}, {len(corpus.train)} training files, {sum(map(len, texts))} chars")

    tok = train_tokenizer(texts)
    eot_id = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot_id)  # documents are separated by <|endoftext|>
    data = torch.tensor(ids, dtype=torch.long)
    n_chars = sum(map(len, texts))
    print(f"tokenizer: vocab {tok.get_vocab_size()}, {len(ids)} training tokens, {n_chars / len(ids):.2f} chars/token")

    config = model_config(tok.get_vocab_size(), eot_id)
    model = LlamaForCausalLM(config)
    n_params = model.num_parameters()
    print(f"model: {n_params} parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(SEED)
    offsets = torch.arange(CONTEXT + 1)
    model.train()
    train_started = time.perf_counter()
    smooth = None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        starts = torch.randint(0, len(data) - CONTEXT - 1, (args.batch,), generator=gen)
        batch = data[starts[:, None] + offsets]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - train_started
            print(
                f"step {step:5d}  loss {loss.item():.4f}  (smoothed {smooth:.4f})  lr {opt.param_groups[0]['lr']:.2e}"
                f"  {elapsed:6.1f} s",
                flush=True,
            )
    train_seconds = time.perf_counter() - train_started

    model_dir = args.out_dir / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    model.eval()
    model.generation_config = GenerationConfig(
        do_sample=False, max_new_tokens=64, bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id
    )
    model.save_pretrained(model_dir)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=EOT,
        pad_token=EOT,
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(model_dir)
    _portable(model_dir)

    heldout = corpus_mod.HELDOUT_FILE.read_text(encoding="utf-8")
    heldout_tokens = len(load.encode(model_dir, heldout))
    ppl = load.perplexity(model_dir, heldout, context=CONTEXT)
    info = load.load_model_dir(model_dir)
    print(
        f"held-out perplexity {ppl:.3f} over {heldout_tokens} tokens ({corpus_mod.HELDOUT_FILE.name}, "
        f"windows of {CONTEXT})"
    )
    metrics = {
        "parameters": n_params,
        "parameters_in_safetensors": info.num_parameters,
        "model_dir_bytes": sum(p.stat().st_size for p in model_dir.iterdir()),
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
        "steps": args.steps,
        "batch": args.batch,
        "context": CONTEXT,
        "tokens_seen": args.steps * args.batch * CONTEXT,
        "training_tokens": len(ids),
        "peak_lr": args.lr,
        "final_train_loss_smoothed": round(smooth or float("nan"), 4),
        "heldout_perplexity": round(ppl, 4),
        "heldout_tokens": heldout_tokens,
        "heldout_context": CONTEXT,
        "vocab_size": tok.get_vocab_size(),
        "corpus": {
            "python": corpus.python,
            "train_files": len(corpus.train),
            "train_chars": n_chars,
            "heldout_file": corpus_mod.HELDOUT_FILE.name,
        },
        "threads": args.threads,
        "seed": SEED,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "machine": platform.machine(),
    }
    (args.out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
