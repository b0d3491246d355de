"""User mistakes outside the training recipe, through the command lines: each is one line on stderr naming the
file / key and the bad value, exit status 2 and no traceback (papermill: a non-zero exit naming the parameter, before
anything heavy runs). The commands run in this process (their `main`/`cli` with the same argv; a new Python adds an
import of torch per case and nothing checked): `test_python_m_entry_point_exits_2` and one papermill case keep the real
`python -m` launch and its exit status."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_module, run_notebook, write_config

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}


def run_process(*args, timeout=300):
    return subprocess.run([sys.executable, *map(str, args)], env=ENV, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def run(*args):
    "`python -m <module> argv...` in this process, from the repository root (conftest.run_module)."
    assert args[0] == "-m", args
    return run_module(args[1], *args[2:])


def assert_one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    assert "Traceback" not in r.stderr, r.stderr[-4000:]
    err = [l for l in r.stderr.splitlines() if "error: " in l]
    assert len(err) == 1, r.stderr[-4000:]
    for n in needles: assert str(n) in err[0], (n, err[0])


def test_python_m_entry_point_exits_2(tiny, tmp_path):
    "The real launch: `python -m domino_research.train` with a missing target is one line on stderr and exit status 2."
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "n_eval_prompts": 0})
    r = run_process("-m", "domino_research.train", "--config", cfg, "--max_steps", 1, "--target", "./models/qwen3-typo")
    assert_one_line_error(r, "./models/qwen3-typo")


# ------------------------------------------------------------------ bench
@pytest.mark.parametrize("argv, needle", [
    (["decode", "--draft", "d", "--n_eval_prompts", "-1"], "argument --n_eval_prompts: must be >= 1, got -1"),
    (["decode", "--draft", "d", "--n_eval_prompts", "0"], "argument --n_eval_prompts: must be >= 1, got 0"),
    (["decode", "--draft", "d", "--max_new_tokens", "0"], "argument --max_new_tokens: must be >= 1, got 0"),
    (["loss", "--chunk_size", "0"], "argument --chunk_size: must be >= 1, got 0"),
    (["loss", "--variants", "foo"], "argument --variants: unknown variant(s) foo"),
    (["loss", "--tokens", "-5"], "argument --tokens: must be >= 1, got -5"),
])
def test_bench_bad_arguments(argv, needle):
    assert_one_line_error(run("-m", "domino_research.bench", *argv), needle)


def test_bench_decode_bad_paths(tmp_path):
    missing = tmp_path / "no_such_run"
    assert_one_line_error(run("-m", "domino_research.bench", "decode", "--draft", missing), missing, "no such directory")
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    empty = tmp_path / "empty_target"
    empty.mkdir()
    assert_one_line_error(run("-m", "domino_research.bench", "decode", "--draft", draft, "--target", empty),
                          empty, "has no config.json")
    t0 = time.perf_counter()
    r = run("-m", "domino_research.bench", "decode", "--draft", draft, "--target", "./models/qwen3-typo")
    assert_one_line_error(r, "target './models/qwen3-typo' does not exist")
    assert time.perf_counter() - t0 < 60                       # decided locally: no hub timeout


# ------------------------------------------------------------------ training command line (data and target inputs)
def train(tiny, tmp_path, **overrides):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "n_eval_prompts": 0})
    args = [x for k, v in overrides.items() for x in (f"--{k}", v)]
    return run("-m", "domino_research.train", "--config", cfg, "--max_steps", 1, "--run_name", "bad", *args)


def test_train_binary_jsonl(tiny, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    assert_one_line_error(train(tiny, tmp_path, train_data=data), "train_data:", data, "line 1: not UTF-8 text")


def test_train_data_without_suffix(tiny, tmp_path):
    data = tmp_path / "train"
    shutil.copy(tiny["root"] / "train.jsonl", data)
    assert_one_line_error(train(tiny, tmp_path, train_data=data), "train_data:", data, "unknown chat data file type")


@pytest.mark.parametrize("path", ["data/trian.jsonl", "./typo/train", "eval.parquet"])
def test_train_missing_local_data_path(tiny, tmp_path, path):
    r = train(tiny, tmp_path, eval_data=path)
    assert_one_line_error(r, f"eval_data: chat data '{path}' does not exist")


def test_train_unknown_embedded_split(tiny, tmp_path):
    assert_one_line_error(train(tiny, tmp_path, train_data="embedded:tset"), "train_data:", "unknown embedded split 'tset'")


def test_train_target_without_weights(tiny, tmp_path):
    t = tmp_path / "target"
    shutil.copytree(tiny["root"] / "target", t)
    for w in t.glob("*.safetensors"): w.unlink()
    assert_one_line_error(train(tiny, tmp_path, target=t), t, "has config.json but no weights")


def test_train_missing_local_target(tiny, tmp_path):
    assert_one_line_error(train(tiny, tmp_path, target="./models/qwen3-typo"), "./models/qwen3-typo")


def test_train_target_without_config(tiny, tmp_path):
    t = tmp_path / "target"
    t.mkdir()
    assert_one_line_error(train(tiny, tmp_path, target=t), t, "has no config.json")


# ------------------------------------------------------------------ papermill notebooks
def papermill_process(nb, tmp_path, *params):
    args = [x for k, v in zip(params[::2], params[1::2]) for x in ("-p", k, v)]
    return run_process("-m", "papermill", REPO / "nbs" / nb, tmp_path / "out.ipynb", "--cwd", REPO / "nbs", *args)


@pytest.mark.parametrize("nb, params, needle", [
    ("evaluate.ipynb", ("n_eval_prompts", "two"), "parameter 'n_eval_prompts' expects int, got 'two' (str)"),
    ("evaluate.ipynb", ("max_new_tokens", "0"), "parameter 'max_new_tokens' must be >= 1, got 0"),
    ("evaluate.ipynb", ("candidate_ks", "16,x"), "parameter 'candidate_ks' must be a comma list of integers"),
    ("ablations.ipynb", ("steps", "two"), "parameter 'steps' expects int, got 'two'"),
    ("ablations.ipynb", ("base_overrides", "[1, 2]"), "parameter 'base_overrides' must be a YAML mapping"),
    ("ablations.ipynb", ("jobs", "0"), "parameter 'jobs' must be >= 1, got 0"),
    ("evaluate.ipynb", ("candidate_ks", "0,-4"), "parameter 'candidate_ks' must list integers >= 1"),
    ("evaluate.ipynb", ("draft_dir", "/nonexistent/draft"), "parameter 'draft_dir': /nonexistent/draft does not exist"),
    ("evaluate.ipynb", ("temperature", "-0.5"), "parameter 'temperature' must be a finite number >= 0"),
    ("evaluate.ipynb", ("prompt_seed", "-1"), "parameter 'prompt_seed' must be >= 0, got -1"),
    ("evaluate.ipynb", ("drafter", "ngram", "drafter_settings", "{prompt_lookup_min: 3, prompt_lookup_max: 2}"),
     "prompt_lookup_min 3 > prompt_lookup_max 2: no n-gram length to look up"),
    ("evaluate.ipynb", ("drafter", "ngram", "candidate_ks", "16,64"), "a candidate pool is re-ranked by the Domino head"),
    ("evaluate.ipynb", ("prompt_lookup_max", "2"), "parameter 'prompt_lookup_max' is a drafter setting: pass it as -p drafter"),
    ("evaluate.ipynb", ("drafter", "lookup", "drafter_settings", "{use_head: false}"),
     "'use_head' is neither an evaluation key nor a setting of drafter 'lookup'"),
    ("train.ipynb", ("extra", "[1, 2]"), "parameter 'extra' must be a YAML mapping"),
    ("train.ipynb", ("extra", "{bad"), "parameter 'extra' is not valid YAML"),
    ("train.ipynb", ("extra", "{max_steps: 3}"), "'extra' sets ['max_steps'], which are parameters of this notebook"),
    ("train.ipynb", ("max_stepz", "2"), "unknown parameter 'max_stepz'; did you mean 'max_steps'?"),   # ran the default
    ("evaluate.ipynb", ("temprature", "0.5"), "unknown parameter 'temprature'; did you mean 'temperature'?"),
])
def test_papermill_bad_parameter(nb, params, needle):
    ran, error = run_notebook(nb, **dict(zip(params[::2], params[1::2])))   # in this process
    assert error is not None and needle in str(error), error
    assert ran == 3                                            # parameters, injected parameters, the check: nothing else ran


def test_papermill_bad_parameter_through_papermill(tmp_path):
    "The same refusal through the real `python -m papermill` launch: a non-zero exit naming the parameter, one check cell run."
    r = papermill_process("evaluate.ipynb", tmp_path, "n_eval_prompts", "two")
    assert r.returncode != 0 and "parameter 'n_eval_prompts' expects int, got 'two' (str)" in r.stderr, r.stderr[-3000:]
    cells = json.loads((tmp_path / "out.ipynb").read_text())["cells"]
    ran = [c for c in cells if c["cell_type"] == "code" and c.get("execution_count")]
    assert len(ran) == 3                                       # parameters, injected parameters, the check: nothing else ran


# ------------------------------------------------------------------ found by a careless-user pass
@pytest.mark.parametrize("args, needle", [
    (("-m", "domino_research.train", "--max_steps", "2", "--run_name", "p"), "--config is required"),
    (("-m", "domino_research.bench", "loss", "--device", "gpu", "--vocab", "64", "--hidden", "32", "--emb", "8", "--gru", "16",
      "--tokens", "64"), "not a device name"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--threads", "0"), "--threads must be >= 1"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--vocab_size", "5"), "--vocab_size must be >= 262"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--stages", "tokenizer"), "run the earlier --stages first"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--corpus", "stdlib", "--task", "docstring",
      "--extra_packages", "numpy,no_such_package_x"), "'no_such_package_x' is not an installed package's import name"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--corpus", "stdlib", "--extra_packages", "certifi"),
     "does not declare a licence of MIT, BSD"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--extra_packages", "numpy"), "pass corpus_source='stdlib'"),
    (("-m", "domino_research.regenerate", "--target", "domino_research/assets/embedded/target", "--data", "{tmp}/empty.jsonl",
      "--out", "{tmp}/o.jsonl"), "has no rows to regenerate"),
    (("-m", "domino_research.regenerate", "--target", "domino_research/assets/embedded/target", "--data", "{tmp}/empty.jsonl",
      "--out", "{tmp}"), "is a folder"),
])
def test_more_cli_mistakes_are_one_line(tmp_path, args, needle):
    _one_line(tmp_path, args, needle)


def _one_line(tmp_path, args, needle):
    (tmp_path / "empty.jsonl").write_text("")
    assert_one_line_error(run(*[a.format(tmp=tmp_path) for a in args]), needle)


# ------------------------------------------------------------------ a third careless-user pass (issue 36)
@pytest.mark.parametrize("args, needle", [
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--lr", "-1"), "argument --lr: must be a finite number in"),
    (("-m", "domino_research.embedded_build", "--out", "{tmp}/b", "--lr", "nan"), "argument --lr: must be a finite number in"),
    (("-m", "domino_research.bench", "data", "--workdir", "{tmp}/missing"), "--workdir {tmp}/missing does not exist"),
    (("-m", "domino_research.bench", "memory", "--num_processes", "1000000"), "--num_processes: must be at most 1024"),
    (("-m", "domino_research.bench", "memory", "--micro_batch_size", "100000"), "its real attention mask) needs at least"),
    (("-m", "domino_research.bench", "loss", "--tokens", "1000000"), "the naive variant's float32 logits) needs at least"),
    (("-m", "domino_research.bench", "decode", "--drafter", "ngram", "--num_speculative_tokens", "1000000"),
     "num_speculative_tokens: must be in [1, 255], got 1000000"),
    (("-m", "domino_research.train", "--config", "embedded_domino", "--learning_rate", "0.001", "--learning_rate", "0.002"),
     "--learning_rate is given twice"),
    (("-m", "domino_research.train", "--config", "embedded_domino", "--run_name", "a\nb"), "run_name: must be one plain folder"),
    (("-m", "domino_research.train", "--config", "embedded_domino", "--output_dir", ""), "output_dir: is empty"),
    (("-m", "domino_research.train", "--config", "{tmp}/latin1.yaml"), "latin1.yaml: line 2: byte 0xe9 is not UTF-8 text"),
])
def test_issue36_mistakes_are_one_line(tmp_path, args, needle):
    "Each was a traceback, a hang or a silent wrong run before (issue 36); now one line naming the key and its limit."
    (tmp_path / "latin1.yaml").write_bytes("recipe: domino\n# réglages\n".encode("latin-1"))
    _one_line(tmp_path, args, needle.format(tmp=tmp_path))


def test_command_line_text_keys_stay_text():
    from domino_research.train_config import parse_train_args
    _, o = parse_train_args(["--output_dir", "~", "--eval_data", "null", "--max_steps", "3",
                             "--learning_rate", "1e-3", "--run_name=2026-12-03"])
    assert o == {"run_name": "2026-12-03", "output_dir": "~", "eval_data": None, "max_steps": 3, "learning_rate": 1e-3}
    assert parse_train_args(["--run_name", "001"])[1] == {"run_name": "001"}       # text, not the number 1


# ------------------------------------------------------------------ values the training cannot use (in-process: no model loads)
def _train_cli_error(capsys, *argv) -> str:
    "The one `error:` line (exit 2, no traceback) that the training command line, run in this process, prints."
    from domino_research.train import cli
    with pytest.raises(SystemExit) as e: cli([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error: ")]
    assert e.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("key, value, says", [
    ("max_grad_norm", "-1.0", "must be a finite number > 0"),      # clip_grad_norm_ with a negative norm flips the gradient
    ("min_lr_ratio", "-5.0", "must be a finite number in [0, 1]"),  # the cosine floor below 0: lr 0.0
    ("save_every_steps", "-1", "must be >= 1, or null"),           # -1 saved every step
    ("adam_beta1", "2.0", "must be a finite number in [0, 1)"),
    ("weight_decay", "-1", "must be a finite number in [0, 100]"),
    ("seed", "-1", "must be in [0, 4294967295]"),
    ("learning_rate", ".inf", "must be a finite number in (0, 10]"),
    ("learning_rate", "1e300", "must be a finite number in (0, 10]"),          # passed '> 0', then overflowed in AdamW
    ("dist_timeout_minutes", "1e300", "must be a finite number in (0, 10080]"),  # passed '> 0', then overflowed the timer
])
def test_train_value_out_of_range_is_one_line(tiny, tmp_path, capsys, key, value, says):
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs")})
    err = _train_cli_error(capsys, "--config", cfg, f"--{key}", value)
    assert f"{key}: {says}" in err and "command line" in err, err
    assert not (tmp_path / "runs").exists()


def test_every_numeric_key_has_a_range_checked_when_read(tiny, tmp_path):
    """Walks every numeric field of both recipes: each declares a range, and a value just outside it, in a YAML file, is
    refused naming the key and the file."""
    import dataclasses, typing
    from domino_research.config import ConfigError, parse_range
    from domino_research.train_config import RECIPE_CONFIGS, load_train_config
    checked = 0
    for cls in RECIPE_CONFIGS.values():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kinds = set(typing.get_args(hints[f.name]) or [hints[f.name]]) - {type(None)}
            if not kinds <= {int, float}: continue
            assert "range" in f.metadata, f"{cls.__name__}.{f.name} holds a number but declares no range (ranged(default, spec))"
            lo, lo_in, _, _ = parse_range(f.metadata["range"])
            bad = (lo - 1 if lo_in else lo) if float in kinds else int(lo - 1 if lo_in else lo)
            base = {k: v for k, v in tiny["base"].items() if k in {g.name for g in dataclasses.fields(cls)}}
            cfg = write_config(tmp_path / "c.yaml", {**base, "recipe": cls().recipe, f.name: bad})
            with pytest.raises(ConfigError) as e: load_train_config(cfg)
            assert str(e.value).startswith(f"{f.name}: must be") and "c.yaml" in str(e.value), str(e.value)
            checked += 1
    assert checked >= 60                                           # 33 DFlash keys + the Domino recipe's


def test_duplicate_yaml_key_is_refused_with_both_lines(tiny, tmp_path, capsys):
    "PyYAML keeps the last of two equal keys silently: the first edit looked applied and was not."
    cfg = tmp_path / "c.yaml"
    write_config(cfg, {**tiny["base"], "output_dir": str(tmp_path / "runs")})
    cfg.write_text(cfg.read_text() + "learning_rate: 0.01\n")      # learning_rate is already on line 15
    line = 1 + next(i for i, l in enumerate(cfg.read_text().splitlines()) if l.startswith("learning_rate"))
    n = len(cfg.read_text().splitlines())
    err = _train_cli_error(capsys, "--config", cfg)
    assert f"{cfg}: duplicate key 'learning_rate' on lines {line} and {n}" in err, err


# ------------------------------------------------------------------ Ctrl-C: one line, never a traceback (issue 36)
def _ctrl_c_after(args, ready: str, timeout: float = 240, env=None) -> subprocess.CompletedProcess:
    "`python args...` interrupted (SIGINT, as Ctrl-C) once `ready` appears in its output: (exit status, stdout, stderr)."
    import signal, threading
    p = subprocess.Popen([sys.executable, *map(str, args)], env=env or ENV, cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    seen, lines = threading.Event(), []
    def read():
        for line in iter(p.stdout.readline, ""):
            lines.append(line)
            if ready in line: seen.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(timeout), "".join(lines)[-3000:]
        time.sleep(1)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    finally:
        if p.poll() is None: p.kill()
    reader.join(5)
    return subprocess.CompletedProcess(args, p.returncode, "", "".join(lines))


def test_ctrl_c_in_bench_decode_is_one_line():
    # piped, bench decode draws no bar (notebook 08): its decoding phase is wrapped here to say when it starts
    r = _ctrl_c_after(["-c", "import domino_research.evaluation as e, runpy; phase = e.Phase\n"
                       "def announce(*a, **k): print('decoding starts', flush=True); return phase(*a, **k)\n"
                       "e.Phase = announce; import sys; sys.argv = ['bench', 'decode', '--drafter', 'ngram', "
                       "'--n_eval_prompts', '64', '--max_new_tokens', '256']; runpy.run_module('domino_research.bench', "
                       "run_name='__main__')"], ready="decoding starts")
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert [l for l in r.stderr.splitlines() if "error: " in l] == \
        ["error: bench decode: interrupted (Ctrl-C); nothing was written"], r.stderr[-3000:]   # on a line of its own


def test_ctrl_c_in_embedded_build_is_one_line_naming_the_stages_left(tmp_path):
    out = tmp_path / "b"
    r = _ctrl_c_after(["-m", "domino_research.embedded_build", "--out", out, "--stages", "corpus,tokenizer,target",
                       "--steps", "100000"], ready="stage tokenizer done")
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr[-3000:]
    err = [l for l in r.stderr.splitlines() if "error: " in l]
    assert err == [f"error: interrupted (Ctrl-C) during stage target; corpus, tokenizer complete in {out}; continue with "
                   "the same command and --stages target"], r.stderr[-3000:]
