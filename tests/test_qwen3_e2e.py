"""The whole chain on a tiny model laid out exactly like Qwen/Qwen3-8B (real vocabulary size, special-token ids, config
fields and chat template; tests/qwen3_snapshot.py), with the shipped qwen3_8b_* configs overridden only in sizes and paths:
regenerate (thinking off) → train on 2 gloo ranks (target sharded or not) → export → speculative decoding, lossless."""
import json, os, socket, subprocess, sys

import pytest
import torch
from transformers import AutoTokenizer

from conftest import REPO
from qwen3_snapshot import QWEN3_MASK_TOKEN_ID, QWEN3_VOCAB_SIZE, write_qwen3_snapshot

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
PROMPTS = [[{"role": "user", "content": f"Count from {s} to {s + 5}, please."}] for s in (3, 10, 21, 40, 57, 61)] + [
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Say hello."}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3 + 3?"}]]
CORPUS = [m["content"] for p in PROMPTS for m in p] + ["user\nassistant\nsystem\n", "Hello there, how are you? I'm good."]
# sizes of the tiny run; every other value comes from the shipped config
SIZES = dict(seq_length=160, num_anchors=4, max_steps=2, micro_batch_size=1, save_every_steps=1, eval_every_steps=2,
             max_eval_samples=2)
DOMINO_SIZES = dict(emb_dim=16, gru_hidden_dim=32)
# The one non-size override: the shipped configs train with flex_attention, and the pinned torch has no FlexAttention
# backward on CPU (NotImplementedError), so training refuses it on CPU with a ConfigError
# (test_shipped_flex_config_is_refused_on_cpu). make gpu-check runs the shipped flex_attention on CUDA.
CPU_BACKEND = dict(attention_backend="sdpa")
MAX_NEW = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=300):
    p = subprocess.run(list(map(str, cmd)), env=ENV, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert p.returncode == 0, " ".join(map(str, cmd)) + "\n" + p.stdout[-3000:] + p.stderr[-5000:]
    return p


@pytest.fixture(scope="session")
def qwen3(tmp_path_factory):
    "The tiny Qwen3-8B-layout target, and its own answers to the prompts (regenerate CLI, thinking off)."
    root = tmp_path_factory.mktemp("qwen3")
    target = write_qwen3_snapshot(root / "Qwen3-8B", CORPUS)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in PROMPTS))
    p = run([sys.executable, "-m", "domino_research.regenerate", "--target", target, "--data", root / "prompts.jsonl",
             "--out", root / "regenerated.jsonl", "--max_new_tokens", MAX_NEW, "--batch_size", 4])
    assert f"{len(PROMPTS)} rows written" in p.stdout, p.stdout
    return dict(root=root, target=target, data=root / "regenerated.jsonl")


def test_snapshot_is_qwen3_8b_shaped(qwen3):
    "The fixture has Qwen3-8B's ids and template: rendering a chat gives the token ids Qwen/Qwen3-8B gives."
    tok = AutoTokenizer.from_pretrained(qwen3["target"])
    assert len(tok) == QWEN3_MASK_TOKEN_ID and tok.eos_token_id == 151645 and tok.pad_token_id == 151643
    assert [tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<think>", "</think>")] == [151644, 151667, 151668]
    cfg = json.loads((qwen3["target"] / "config.json").read_text())
    assert (
        cfg["vocab_size"] == QWEN3_VOCAB_SIZE and cfg["rope_parameters"]["rope_theta"] == 1e6 and not cfg["tie_word_embeddings"]
    )
    chat = [{"role": "user", "content": "Hello assistant"}, {"role": "assistant", "content": "Hello user"},
            {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "I'm good"}]
    text = tok.apply_chat_template(chat, tokenize=False)
    # Qwen/Qwen3-8B's rendering of this chat: only the answer after the last user turn carries an (empty) think block
    assert text == (
        "<|im_start|>user\nHello assistant<|im_end|>\n<|im_start|>assistant\nHello user<|im_end|>\n"
        "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nI'm good<|im_end|>\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # the special and think tokens of Qwen/Qwen3-8B's own encoding of this chat, in order (its BPE ids differ from ours)
    assert [i for i in ids if i >= 151643] == [151644, 151645, 151644, 151645, 151644, 151645, 151644, 151667, 151668, 151645]
    gen_off = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    gen_on = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert gen_off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and gen_on.endswith("<|im_start|>assistant\n")
    # an answer cut inside its reasoning: Qwen3's template would put an empty think block before it; trained as generated
    from domino_research.data import render_chat
    cut = [chat[0], {"role": "assistant", "content": "<think>\nThe user greets me", "cut": True}]
    assert "</think>\n\n<think>" in tok.apply_chat_template(cut, tokenize=False, enable_thinking=True)
    assert render_chat(tok, cut, enable_thinking=True) == gen_on + "<think>\nThe user greets me<|im_end|>\n"
    assert render_chat(tok, chat) == text


def test_regenerated_rows_train_with_thinking_on_and_off(qwen3):
    "The regenerated answers are the target's; each renders and masks with Qwen3's template, thinking off and on."
    from domino_research.data import build_chat_dataset, load_chat_rows
    rows = load_chat_rows(str(qwen3["data"]))
    assert len(rows) == len(PROMPTS) and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    assert [m["role"] for m in rows[-1]["messages"]] == ["user", "assistant", "user", "assistant"]
    tok = AutoTokenizer.from_pretrained(qwen3["target"])
    from domino_research.data import render_chat        # thinking off, as generated: the template's own rendering
    assert all(render_chat(tok, r["messages"]) == tok.apply_chat_template(r["messages"], tokenize=False) for r in rows)
    for thinking in (False, True):
        ds, stats = build_chat_dataset(tok, rows, seq_length=10**6, enable_thinking=thinking, verbose=False)
        assert stats["kept"] == len(rows), stats
        for ex, r in zip(ds, rows):
            masked = tok.decode([t for t, m in zip(ex["input_ids"], ex["loss_mask"]) if m])
            answers = [m["content"].split("</think>")[-1].lstrip("\n") for m in r["messages"] if m["role"] == "assistant"]
            assert masked.replace("<|im_end|>", "") == "".join(answers), (masked, answers)


def test_shipped_flex_config_is_refused_on_cpu(qwen3, tmp_path):
    "The shipped attention_backend (flex_attention) cannot train on CPU with the pinned torch: one clear error, no run folder."
    if torch.cuda.is_available(): pytest.skip("CUDA machine: flex_attention is allowed")
    from domino_research.config import ConfigError
    from domino_research.train import load_train_config
    with pytest.raises(ConfigError, match="flex_attention has no backward on CPU"):
        load_train_config("qwen3_8b_domino", target=str(qwen3["target"]), train_data=str(qwen3["data"]),
                          output_dir=str(tmp_path), **SIZES)
    assert not any(tmp_path.iterdir())


def test_thinking_mode_of_the_data_is_kept(qwen3, tmp_path):
    "The data was regenerated with thinking off (its .meta.json says so): training it with thinking on is refused in one line."
    from domino_research.config import ConfigError
    from domino_research.train import main
    with pytest.raises(ConfigError, match="regenerated with enable_thinking=false .* set enable_thinking: false"):
        main("qwen3_8b_domino", target=str(qwen3["target"]), train_data=str(qwen3["data"]), eval_data=None,
             enable_thinking=True, output_dir=str(tmp_path), run_name="think", **SIZES, **DOMINO_SIZES, **CPU_BACKEND)
    assert not (tmp_path / "think").exists()


@pytest.mark.parametrize("config,shard", [("qwen3_8b_domino", True), ("qwen3_8b_dflash", False)])
def test_shipped_config_end_to_end(qwen3, tmp_path, config, shard):
    "Shipped config → 2-rank gloo training (validation on, checkpoints) → export → lossless speculative decoding."
    from domino_research.evaluation import evaluate_draft
    from domino_research.export import export_draft, read_draft_config
    over = {**SIZES, **(DOMINO_SIZES if "domino" in config else {}), **CPU_BACKEND, "shard_target": shard,
            "target": qwen3["target"], "train_data": qwen3["data"], "eval_data": qwen3["data"],
            "output_dir": tmp_path / "runs", "run_name": "tiny"}
    args = [a for k, v in over.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={free_port()}", "-m", "domino_research.train", "--config", config, *args], timeout=400)
    run_dir = tmp_path / "runs" / "tiny"
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2] and any("eval/loss" in r for r in rows), rows
    out = export_draft(run_dir, tmp_path / "exported")
    d = read_draft_config(out)["dflash_config"]
    assert d["mask_token_id"] == QWEN3_MASK_TOKEN_ID and d["block_size"] == 16 and d["target_layer_ids"] == [1, 2, 3, 4, 5]
    assert d["shift_label"] == ("domino" in config)
    # a wrong export (keys, dtype, vocabulary rows, mask id, layer ids) fails at the first verify step: 2 prompts x 8 tokens
    # (14 verify steps, each cropping the cache) check what 3 x 32 did; a Domino step here costs ~0.6 s of CPU
    res = evaluate_draft(out, target=qwen3["target"], prompts=qwen3["root"] / "prompts.jsonl", n_prompts=2,
                         max_new_tokens=MAX_NEW // 2, warmup=0)
    assert res["lossless"] and res["new_tokens"] >= 3, res
