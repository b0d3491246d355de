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


def make_target(d, seed=0):
    tok = toy_chat_tokenizer(["Say hi. Add? Again? Prompt only. Be brief. Hello there, how are you?"] * 10, vocab_size=280)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=256, initializer_range=0.5,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("target"))


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
    assert r.returncode == 2
    assert f"regenerate: error: {data} line 2: invalid JSON" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def assert_one_line_error(r, *needles):
    "Exit status 2, `regenerate: error:` on stderr naming each needle, no traceback."
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert "regenerate: error: " in r.stderr, r.stderr
    for n in needles: assert str(n) in r.stderr, (n, r.stderr)


def test_cli_resume_with_another_target_or_settings_is_refused(target_dir, tmp_path):
    data, out = tmp_path / "data.jsonl", tmp_path / "out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    io = ["--data", data, "--out", out]
    args = [*io, "--max_new_tokens", 5, "--batch_size", 2, "--limit", 1]
    r = run_cli("--target", target_dir, *args)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())
    assert meta["target"] == str(Path(target_dir).resolve()) and meta["max_new_tokens"] == 5
    written = out.read_text()
    other = make_target(tmp_path / "other", seed=1)            # same architecture and tokenizer, other weights
    r = run_cli("--target", other, *args)
    assert_one_line_error(r, out, "target: was", str(other.resolve()), "use a new --out")
    r = run_cli("--target", target_dir, *io, "--max_new_tokens", 7)
    assert_one_line_error(r, "max_new_tokens: was 5, now 7")
    r = run_cli("--target", target_dir, *args, "--temperature", 0.5)
    assert_one_line_error(r, "temperature: was 0.0, now 0.5")
    assert out.read_text() == written                          # nothing appended by a refused resume
    r = run_cli("--target", target_dir, *io, "--max_new_tokens", 5, "--limit", 3)   # the same settings resume
    assert r.returncode == 0, r.stderr
    assert "(1 already done)" in r.stdout and out.read_text().startswith(written)


@pytest.mark.parametrize("case", ["missing_local", "no_config", "no_weights", "binary_data", "no_suffix", "bad_setting",
                                  "bad_shard", "merge_one_shard"])
def test_cli_bad_input_is_one_line(target_dir, tmp_path, case):
    data, out = tmp_path / "data.jsonl", tmp_path / "out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    target, needle = target_dir, None
    if case == "missing_local": target = needle = tmp_path / "modles" / "qwen3"
    if case == "no_config": target = tmp_path / "empty"; target.mkdir(); needle = "has no config.json"
    if case == "no_weights":
        target = tmp_path / "cfg_only"; target.mkdir(); (target / "config.json").write_text((Path(target_dir) / "config.json").read_text())
        needle = "has config.json but no weights"
    if case == "binary_data": data.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe"); needle = "line 1: not UTF-8 text"
    if case == "no_suffix": data = tmp_path / "data"; data.write_text(json.dumps(ROWS[0]) + "\n"); needle = "unknown chat data file type"
    extra = ["--max_new_tokens", 0] if case == "bad_setting" else []
    if case == "bad_setting": needle = "max_new_tokens must be >= 1"
    if case == "bad_shard": extra, needle = ["--shard", "3/2"], "--shard: expected K/N with 0 <= K < N"
    if case == "merge_one_shard":                                # a shard's output, merged without its sibling
        assert run_cli("--target", target, "--data", data, "--out", tmp_path / "s0.jsonl", "--shard", "0/2").returncode == 0
        r = run_cli("--merge", tmp_path / "s0.jsonl", "--out", out)
        assert_one_line_error(r, "need each of the shards 0/2")
        assert not out.exists(); return
    r = run_cli("--target", target, "--data", data, "--out", out, *extra)
    assert_one_line_error(r, needle)
    assert not out.exists()


def serve(target_dir):
    "An OpenAI-compatible server in this process that answers with the target in `target_dir` (greedy, one request at a time)."
    import http.server
    import threading

    from transformers import AutoTokenizer
    from domino_research.regenerate import _generate_answers
    from domino_research.target import load_target
    target, tok = load_target(target_dir, device="cpu"), AutoTokenizer.from_pretrained(target_dir)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass

        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

        def do_GET(self): self._send({"data": [{"id": "tiny"}]})

        def do_POST(self):
            b = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            (text, n, done), = _generate_answers(target, tok, [b["messages"]], b["max_tokens"], 0.0,
                                                 b["chat_template_kwargs"]["enable_thinking"])
            self._send({"choices": [{"message": {"content": text}, "finish_reason": "stop" if done else "length"}],
                        "usage": {"completion_tokens": n}})
    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"


def test_cli_server_backend_writes_what_the_local_target_writes(target_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    common = ["--data", data, "--max_new_tokens", 5, "--batch_size", 2]
    assert run_cli("--target", target_dir, *common, "--out", tmp_path / "local.jsonl").returncode == 0
    srv, url = serve(target_dir)
    try:
        r = run_cli("--server", url, "--tokenizer", target_dir, "--concurrency", 2, *common, "--out", tmp_path / "server.jsonl")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "server.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()
        assert json.loads((tmp_path / "server.jsonl.meta.json").read_text())["target"] == f"tiny at {url}"
    finally:
        srv.shutdown(); srv.server_close()
    r = run_cli("--server", url, *common, "--out", tmp_path / "never.jsonl")            # the server is gone now
    assert_one_line_error(r, f"--server {url}: cannot reach it")
    assert not (tmp_path / "never.jsonl").exists()
