"`python -m domino_research.regenerate`: a tiny random target regenerates a small file, resumes, and refuses bad input."
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from domino_research.data import toy_chat_tokenizer

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
ROWS = [{"conversations": [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "old answer"}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add?"},
                      {"role": "assistant", "content": "old"}, {"role": "user", "content": "Again?"},
                      {"role": "assistant", "content": "old"}]},
        {"messages": [{"role": "user", "content": "Prompt only"}]}]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    tok = toy_chat_tokenizer(["Say hi. Add? Again? Prompt only. Be brief. Hello there, how are you?"] * 10, vocab_size=280)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256, initializer_range=0.5,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "domino_research.regenerate", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=300)


def test_cli_regenerates_and_resumes(target_dir, tmp_path):
    data, out = tmp_path / "data.jsonl", tmp_path / "out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = ["--target", target_dir, "--data", data, "--out", out, "--max_new_tokens", 5, "--batch_size", 2]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "3 rows written" in r.stdout
    full = out.read_text()
    recs = [json.loads(l) for l in full.splitlines()]
    assert [x["index"] for x in recs] == [0, 1, 2]
    assert [m["role"] for m in recs[1]["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert all(m["content"] != "old" for x in recs for m in x["messages"])
    # an interrupted run: first row plus a torn line; rerunning the same command completes it identically
    out.write_text(full.splitlines(keepends=True)[0] + full.splitlines(keepends=True)[1][:10])
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "(1 already done)" in r.stdout
    assert out.read_text() == full


def test_cli_bad_input_writes_nothing(target_dir, tmp_path):
    data, out = tmp_path / "bad.jsonl", tmp_path / "out.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n" + '{"messages": [{"role": "user"\n')
    r = run_cli("--target", target_dir, "--data", data, "--out", out)
    assert r.returncode == 1
    assert f"regenerate: error: {data} line 2: invalid JSON" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
