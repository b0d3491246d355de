"Shared fixtures: a tiny random Qwen3 target with a Qwen3-style chat tokenizer, chat JSONL data and a recipe config."
import json, os, random
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
REPO = Path(__file__).resolve().parents[1]


def _chat(rng, i, short=False):
    start = rng.randrange(100)
    n = 2 if short else rng.randrange(12, 30)
    answer = " ".join(str(start + k) for k in range(n))
    return {"messages": [{"role": "user", "content": f"count from {start}, {n} numbers"},
                         {"role": "assistant", "content": answer}]}


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    "A directory with target/ (random 8-layer Qwen3 + chat tokenizer), train/val JSONL and a base recipe config dict."
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from domino_research.data import toy_chat_tokenizer
    root = tmp_path_factory.mktemp("tiny")
    rng = random.Random(0)
    train = [_chat(rng, i) for i in range(24)]
    val = [_chat(rng, i) for i in range(6)]
    corpus = [m["content"] for r in train for m in r["messages"]]
    tok = toy_chat_tokenizer(corpus, vocab_size=300, extra_special_tokens=["<|mask|>"])
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                      max_position_embeddings=512)
    Qwen3ForCausalLM(cfg).save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    write_jsonl(root / "train.jsonl", train)
    write_jsonl(root / "val.jsonl", val)
    base = dict(recipe="domino", target=str(root / "target"), train_data=str(root / "train.jsonl"),
                eval_data=str(root / "val.jsonl"), seq_length=96, block_size=4, num_anchors=4,
                mask_token_id=tok.convert_tokens_to_ids("<|mask|>"), draft_num_hidden_layers=2,
                emb_dim=8, gru_hidden_dim=16, micro_batch_size=2, grad_accumulation_steps=1, num_epochs=1,
                learning_rate=1e-3, warmup_ratio=0.0, output_dir=str(root / "runs"))
    return {"root": root, "base": base, "tokenizer": tok}


def write_config(path, d):
    import yaml
    Path(path).write_text(yaml.safe_dump(d, sort_keys=False))
    return str(path)
