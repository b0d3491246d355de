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

from conftest import run_module

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
    "The command in this process (conftest.run_module); tests/test_qwen3_e2e.py's fixture runs the real `python -m` launch."
    return run_module("domino_research.regenerate", *args, cwd=os.getcwd())


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
    if case == "no_config":
        target = tmp_path / "empty"
        target.mkdir()
        needle = "has no config.json"
    if case == "no_weights":
        target = tmp_path / "cfg_only"
        target.mkdir()
        (target / "config.json").write_text((Path(target_dir) / "config.json").read_text())
        needle = "has config.json but no weights"
    if case == "binary_data":
        data.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
        needle = "line 1: not UTF-8 text"
    if case == "no_suffix":
        data = tmp_path / "data"
        data.write_text(json.dumps(ROWS[0]) + "\n")
        needle = "unknown chat data file type"
    extra = ["--max_new_tokens", 0] if case == "bad_setting" else []
    if case == "bad_setting": needle = "max_new_tokens must be >= 1"
    if case == "bad_shard": extra, needle = ["--shard", "3/2"], "--shard: expected K/N with 0 <= K < N"
    if case == "merge_one_shard":                                # a shard's output, merged without its sibling
        assert run_cli("--target", target, "--data", data, "--out", tmp_path / "s0.jsonl", "--shard", "0/2").returncode == 0
        r = run_cli("--merge", tmp_path / "s0.jsonl", "--out", out)
        assert_one_line_error(r, "need each of the shards 0/2")
        assert not out.exists()
        return
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
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

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
        srv.shutdown()
        srv.server_close()
    r = run_cli("--server", url, *common, "--out", tmp_path / "never.jsonl")            # the server is gone now
    assert_one_line_error(r, f"--server {url}: cannot reach it")
    assert not (tmp_path / "never.jsonl").exists()


# --- a fake server (tests/_fake_openai.py): faults, hangs and bad replies; the command runs in this process (`cli`) ---
from _fake_openai import FakeServer, echo, reply  # noqa: E402

from domino_research.regenerate import OpenAIServer, cli  # noqa: E402


def cli_run(capsys, *args):
    "`cli(args)` in this process → (exit status, stdout, stderr)."
    try:
        cli([str(a) for a in args])
        code = 0
    except SystemExit as e: code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code, err, *needles):
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.count("regenerate: error: ") == 1, err
    for n in needles: assert str(n) in err, (n, err)


def chat_file(path, n):
    path.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}) + "\n"
            for i in range(n)
        )
    )
    return path


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(OpenAIServer, "backoff", 0.01)     # the retries' waits, not their number, shortened


# (case, what the server does, extra flags, the words of the one-line error, requests the server should see)
FAULTS = [
    ("error_object", lambda n, b: {"object": "error", "message": "boom"}, [], "the reply has no choices[0].message", 1),
    ("no_choices", lambda n, b: {"choices": []}, [], "the reply has no choices[0].message", 1),
    (
        "content_not_text",
        lambda n, b: {"choices": [{"message": {"content": 42}}]},
        [],
        "message.content is a int (42), not text",
        1,
    ),
    ("not_json", lambda n, b: ("raw", b"<html>bad gateway</html>"), [], "the reply is not JSON", 1),
    ("http_400", lambda n, b: ("status", 400), [], "HTTP 400", 1),
    (
        "http_503",
        lambda n, b: ("status", 503),
        [],
        "HTTP 503: {\"error\": {\"message\": \"scripted\"}}; gave up after 3 tries",
        3,
    ),
    ("cut_short", lambda n, b: "cut", [], "the reply was cut short", 3),
    ("dropped", lambda n, b: "drop", [], "the connection broke", 3),
    ("timeout", lambda n, b: "hang", ["--timeout", 0.5], "no answer within --timeout 0.5 s", 1),
]


@pytest.mark.parametrize("case,script,extra,needle,requests", FAULTS, ids=[f[0] for f in FAULTS])
def test_server_fault_is_one_line_naming_the_url(capsys, fast_retries, tmp_path, case, script, extra, needle, requests):
    "Each bad reply or fault ends the run with one line naming the URL and the fault; only transient faults are retried."
    data, out = chat_file(tmp_path / "data.jsonl", 1), tmp_path / "out.jsonl"
    with FakeServer(script, lifetime=20) as srv:
        code, _, err = cli_run(capsys, "--server", srv.url, "--data", data, "--out", out, "--retries", 2, *extra)
        assert_refused(code, err, f"--server {srv.url}/chat/completions: ", needle)
        assert srv.requests == requests


def test_timeout_bounds_a_dripping_reply_in_total(capsys, tmp_path):
    "A reply of ~70 bytes, one every 0.3 s (20 s in all): each read is quick, but `--timeout 2` ends the request at 2 s."
    import time
    data, out = chat_file(tmp_path / "data.jsonl", 1), tmp_path / "out.jsonl"
    with FakeServer(lambda n, b: ("drip", 0.3), lifetime=40) as srv:
        t0 = time.perf_counter()
        code, _, err = cli_run(capsys, "--server", srv.url, "--data", data, "--out", out, "--timeout", 2)
        took = time.perf_counter() - t0
    assert_refused(code, err, f"--server {srv.url}/chat/completions: ", "no answer within --timeout 2 s")
    assert took < 8, f"the request ran {took:.1f} s past --timeout 2"


@pytest.mark.parametrize("flag, value, needle", [("--timeout", "inf", "--timeout must be a finite number of seconds"),
                                                 ("--timeout", "1e300", "--timeout must be a finite number of seconds"),
                                                 ("--temperature", "nan", "temperature must be a finite number in [0, 2]"),
                                                 ("--temperature", "inf", "temperature must be a finite number in [0, 2]")])
def test_absurd_timeout_or_temperature_is_one_line_and_writes_nothing(capsys, tmp_path, flag, value, needle):
    "inf / 1e300 overflowed the socket's timer (a traceback); a NaN temperature was written into .meta.json, breaking it."
    data, out = chat_file(tmp_path / "data.jsonl", 1), tmp_path / "out.jsonl"
    with FakeServer(lifetime=20) as srv:
        code, _, err = cli_run(capsys, "--server", srv.url, "--data", data, "--out", out, flag, value)
        assert srv.requests == 0
    assert_refused(code, err, needle)
    assert not out.exists() and not out.with_name(out.name + ".meta.json").exists()


def test_server_lists_no_model(capsys, tmp_path):
    with FakeServer(models={"data": []}, lifetime=20) as srv:
        code, _, err = cli_run(
            capsys, "--server", srv.url, "--data", chat_file(tmp_path / "d.jsonl", 1), "--out", tmp_path / "o.jsonl"
        )
        assert_refused(code, err, f"--server {srv.url}/models: lists no model", "pass --server_model")


def test_server_transient_faults_are_retried(capsys, fast_retries, tmp_path):
    "A dropped connection, a 503 and a reply cut short, then answers without a token count: every row is written."
    faults = {0: "drop", 1: ("status", 503), 2: "cut"}
    def script(n, body):
        return faults.get(n) or {**reply(f"echo: {body['messages'][-1]['content']}"), "usage": {"completion_tokens": None}}
    data, out = tmp_path / "data.jsonl", tmp_path / "out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with FakeServer(script, lifetime=20) as srv:
        code, stdout, err = cli_run(capsys, "--server", srv.url, "--data", data, "--out", out, "--concurrency", 1)
    assert code == 0, err
    assert "3 rows written" in stdout and "0 tokens (and 4 answers the server did not count)" in stdout
    assert srv.requests == 4 + 3                                          # 4 answers, 3 of them retried once
    recs = [json.loads(l) for l in out.read_text().splitlines()]
    assert [m["content"] for m in recs[1]["messages"] if m["role"] == "assistant"] == ["echo: Add?", "echo: Again?"]


def test_server_requests_in_flight_follow_concurrency_not_batch_size(capsys, monkeypatch, tmp_path):
    "`--concurrency 4 --batch_size 1` keeps 4 requests in flight; rows are fsynced once per batch, not once per row."
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    data, out = chat_file(tmp_path / "data.jsonl", 8), tmp_path / "out.jsonl"
    with FakeServer(latency=0.2, lifetime=20) as srv:
        code, _, err = cli_run(capsys, "--server", srv.url, "--data", data, "--out", out, "--concurrency", 4, "--batch_size", 1)
        assert code == 0, err
        assert srv.max_in_flight == 4
    assert [json.loads(l)["index"] for l in out.read_text().splitlines()] == list(range(8))
    fsyncs.clear()
    with FakeServer(lifetime=20) as srv:
        assert cli_run(capsys, "--server", srv.url, "--data", data, "--out", tmp_path / "o4.jsonl", "--batch_size", 4)[0] == 0
    assert len(fsyncs) <= 3                                              # 8 rows, batches of 4 (+ one at the end)


def test_ctrl_c_ends_a_hung_server_run_at_once_keeping_the_rows(tmp_path):
    "SIGINT while the server never answers: the command exits within seconds with one line; the rows written are intact."
    import signal
    import time
    data, out = chat_file(tmp_path / "data.jsonl", 4), tmp_path / "out.jsonl"
    with FakeServer(lambda n, b: echo(n, b) if n < 2 else "hang", lifetime=120) as srv:
        args = ["--server", srv.url, "--data", data, "--out", out, "--concurrency", 1, "--batch_size", 1]
        p = subprocess.Popen(
            [sys.executable, "-m", "domino_research.regenerate", *map(str, args)],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.time() + 90
            while srv.requests < 3 and time.time() < deadline and p.poll() is None: time.sleep(0.1)   # the 3rd request hangs
            assert srv.requests == 3, p.communicate(timeout=5)
            time.sleep(0.3)
            t0 = time.time()
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=30)
            exit_s = time.time() - t0
        finally:
            p.kill()
    assert exit_s < 5, exit_s
    assert p.returncode == 130, err
    assert "Traceback" not in err and f"regenerate: interrupted; {out} keeps the 2 rows written (of 4)" in err, err
    assert [json.loads(l)["index"] for l in out.read_text().splitlines()] == [0, 1] and out.read_text().endswith("\n")


# --- merge: never loses data, never accepts an unfinished shard, names the file and line of a bad one ---
@pytest.fixture
def shards(capsys, tmp_path):
    "s0.jsonl and s1.jsonl: the two shards of 8 rows, regenerated through a fake server."
    data = chat_file(tmp_path / "data.jsonl", 8)
    with FakeServer(lifetime=20) as srv:
        for k in (0, 1):
            assert (
                cli_run(capsys, "--server", srv.url, "--data", data, "--out", tmp_path / f"s{k}.jsonl", "--shard", f"{k}/2")[0]
                == 0
            )
    return tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"


def test_merge_never_replaces_a_foreign_file(capsys, shards, tmp_path):
    mydata = chat_file(tmp_path / "mydata.jsonl", 5)
    before = mydata.read_bytes()
    code, _, err = cli_run(capsys, "--merge", *shards, "--out", mydata)
    assert_refused(code, err, f"--out {mydata}: exists and is not an earlier merge of these shards")
    assert mydata.read_bytes() == before and not (tmp_path / "mydata.jsonl.meta.json").exists()
    assert_refused(*cli_run(capsys, "--merge", *shards, "--out", shards[0])[::2], "is one of the shards")
    merged = tmp_path / "merged.jsonl"
    assert cli_run(capsys, "--merge", *shards, "--out", merged)[0] == 0
    assert [json.loads(l)["index"] for l in merged.read_text().splitlines()] == list(range(8))
    # an earlier merge of these shards: replaced
    assert cli_run(capsys, "--merge", shards[1], shards[0], "--out", merged)[0] == 0


@pytest.mark.parametrize("case", ["unfinished", "torn_line", "no_index", "stray_row", "old_meta"])
def test_merge_refuses_a_bad_shard_naming_file_and_line(capsys, shards, tmp_path, case):
    s0, s1 = shards
    lines = s1.read_text().splitlines(keepends=True)
    needle = {
        "unfinished": f"{s1}: shard 1/2 is unfinished: 3 of its 4 rows are missing (rows 3, 5, 7)",
        "torn_line": f"{s1} line 4: invalid JSON",
        "no_index": f"{s1} line 1: index None is not one of the rows of shard 1/2",
        "stray_row": f"{s1} line 1: index 2 is not one of the rows of shard 1/2",
        "old_meta": "s1.jsonl.meta.json: records no row count",
    }[case]
    if case == "unfinished": s1.write_text(lines[0])
    if case == "torn_line": s1.write_text("".join(lines[:3]) + lines[3][:15])
    if case == "no_index": s1.write_text(json.dumps({"messages": json.loads(lines[0])["messages"]}) + "\n" + "".join(lines[1:]))
    if case == "stray_row": s1.write_text(lines[0].replace('"index": 1', '"index": 2') + "".join(lines[1:]))
    if case == "old_meta":
        meta = json.loads((tmp_path / "s1.jsonl.meta.json").read_text())
        del meta["rows"]
        (tmp_path / "s1.jsonl.meta.json").write_text(json.dumps(meta))
    code, _, err = cli_run(capsys, "--merge", s0, s1, "--out", tmp_path / "m.jsonl")
    assert_refused(code, err, needle)
    assert not (tmp_path / "m.jsonl").exists() and not (tmp_path / "m.jsonl.meta.json").exists()
