"""Folders a user is handed: a target or tokenizer folder never runs its own Python (with or without a terminal to
answer transformers' "run the custom code? [y/N]"), and a folder that cannot be loaded safely is refused in one line
naming the path, through every command that loads one, as a user would meet it."""
import json, os, pty, shutil, subprocess, sys

import pytest

from conftest import REPO, write_config, write_jsonl

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
CODE = "needs its own Python to load"


def run(args, tmp_path, terminal: bool, timeout=240):
    """`python -m domino_research.<args>`; with `terminal`, stdin is a pty on which "y" (run the code) is already typed:
    whoever asks gets a yes."""
    if not terminal:
        return subprocess.run([sys.executable, "-m", *args], env=ENV, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=tmp_path)
    main, child = pty.openpty()
    try:
        os.write(main, b"y\n")
        return subprocess.run([sys.executable, "-m", *args], env=ENV, capture_output=True, text=True, timeout=timeout,
                              stdin=child, cwd=tmp_path)
    finally:
        os.close(child)
        os.close(main)


def one_line_error(p, *needles) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    err = [l for l in p.stderr.splitlines() if "error: " in l]
    assert len(err) == 1, p.stderr[-3000:]
    for n in needles: assert n in err[0], err[0]
    return err[0]


@pytest.fixture(scope="module")
def planted(tiny, tmp_path_factory):
    """A copy of the tiny target whose config.json (unknown model_type) and tokenizer_config.json (unknown tokenizer
    class) map to planted files that, once imported, leave a marker file next to the folder."""
    root = tmp_path_factory.mktemp("planted")
    evil = root / "evil"
    shutil.copytree(tiny["root"] / "target", evil)
    for name in ("evil_model.py", "evil_tok.py"):
        (evil / name).write_text(f"open({str(root / 'RAN')!r}, 'a').write({name!r} + '\\n')\n")
    def plant(name, **keys): (evil / name).write_text(json.dumps({**json.loads((evil / name).read_text()), **keys}))
    plant("config.json", model_type="evil", auto_map={"AutoConfig": "evil_model.EvilConfig",
                                                      "AutoModelForCausalLM": "evil_model.EvilModel"})
    plant("tokenizer_config.json", tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": [None, "evil_tok.EvilTokenizer"]})
    return {"dir": evil, "marker": root / "RAN"}


def commands(tiny, tmp_path, target) -> dict:
    "Each command that loads a target or a tokenizer, pointed at `target`."
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "target": str(target), "output_dir": str(tmp_path / "runs"),
                                             "max_steps": 1})
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "hello"}]}])
    return {
        "train": ["domino_research.train", "--config", cfg, "--run_name", "r"],
        "bench decode": ["domino_research.bench", "decode", "--drafter", "ngram", "--target", str(target),
                         "--prompts", str(tiny["root"] / "val.jsonl"), "--n_eval_prompts", "1", "--max_new_tokens", "4"],
        "data build": ["domino_research.data", "build", str(rows), "--tokenizer", str(target), "--seq_length", "32",
                       "--cache_dir", str(tmp_path / "cache"), "--num_proc", "1"],
        "regenerate": ["domino_research.regenerate", "--target", str(target), "--data", str(rows),
                       "--out", str(tmp_path / "out.jsonl"), "--max_new_tokens", "2"],
    }


def test_the_plant_runs_when_a_loader_leaves_trust_remote_code_unset(planted, tmp_path):
    """The fault the tests below catch: today's `AutoConfig.from_pretrained(folder)` with a terminal answering "y" imports
    the planted file. (Without this the planted folder might be inert, and the tests below would prove nothing.)"""
    code = (f"from transformers import AutoConfig\n"
            f"try: AutoConfig.from_pretrained({str(planted['dir'])!r})\nexcept Exception: pass")
    main, child = pty.openpty()
    try:
        os.write(main, b"y\n")
        subprocess.run([sys.executable, "-c", code], env=ENV, stdin=child, capture_output=True, timeout=120)
    finally:
        os.close(child)
        os.close(main)
    assert "evil_model.py" in planted["marker"].read_text()
    planted["marker"].unlink()


@pytest.mark.parametrize("terminal", [False, True], ids=["no-terminal", "terminal-answers-y"])
@pytest.mark.parametrize("command", ["train", "bench decode", "data build", "regenerate"])
def test_a_planted_folder_never_runs(tiny, planted, tmp_path, command, terminal):
    p = run(commands(tiny, tmp_path, planted["dir"])[command], tmp_path, terminal)
    line = one_line_error(p, CODE, "--trust_remote_code", "evil_model.py, evil_tok.py")
    assert "[y/N]" not in p.stdout + p.stderr, line               # nothing asked
    assert not planted["marker"].exists(), planted["marker"].read_text()


def test_the_training_config_key_is_the_opt_in(tiny, tmp_path):
    "`trust_remote_code: true` reaches every loader of the run (checked on the objects, no code planted)."
    from domino_research.train_config import DominoTrainConfig
    assert DominoTrainConfig().trust_remote_code is False
    import domino_research.target as target
    seen = []
    real = target.hf_load
    def spy(loader, path, what="target", trust_remote_code=False, **kw):
        seen.append((loader.__name__, trust_remote_code))
        return real(loader, path, what, False, **kw)            # the folder has no code: loading it plainly is the same
    target.hf_load = spy
    try:
        target.load_target_config(tiny["root"] / "target", True)
        target.load_tokenizer(tiny["root"] / "target", True)
        target.load_target(tiny["root"] / "target", trust_remote_code=True)
    finally: target.hf_load = real
    assert seen == [("AutoConfig", True), ("AutoTokenizer", True), ("AutoModelForCausalLM", True)]


# ------------------------------------------------------------------ folders that cannot be loaded: one line, named
@pytest.fixture(scope="module")
def broken(tiny, tmp_path_factory):
    "The tiny target without tokenizer.json, and with only a pickled pytorch_model.bin."
    root = tmp_path_factory.mktemp("broken")
    notok, pickled = root / "no_tokenizer", root / "pickled"
    shutil.copytree(tiny["root"] / "target", notok)
    (notok / "tokenizer.json").unlink()
    shutil.copytree(tiny["root"] / "target", pickled)
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")      # a pickle; opening it would unpickle
    return {"no_tokenizer": notok, "pickled": pickled}


@pytest.mark.parametrize("command", ["train", "bench decode", "regenerate"])
def test_pickle_only_target_refused_naming_the_file(tiny, broken, tmp_path, command):
    p = run(commands(tiny, tmp_path, broken["pickled"])[command], tmp_path, terminal=False)
    one_line_error(p, str(broken["pickled"] / "pytorch_model.bin"), "safetensors")


@pytest.mark.parametrize("command", ["train", "bench decode", "data build", "regenerate"])
def test_target_without_tokenizer_json_named(tiny, broken, tmp_path, command):
    p = run(commands(tiny, tmp_path, broken["no_tokenizer"])[command], tmp_path, terminal=False)
    one_line_error(p, str(broken["no_tokenizer"] / "tokenizer.json"))


def test_missing_tokenizer_folder_named(tiny, tmp_path):
    "`data build --tokenizer /nonexistent` said transformers' 'Repo id must be in the form ...'."
    argv = commands(tiny, tmp_path, "/nonexistent/tokenizer")["data build"]
    p = run(argv, tmp_path, terminal=False)
    one_line_error(p, "'/nonexistent/tokenizer' does not exist")
    assert "Repo id" not in p.stderr
