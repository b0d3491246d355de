"The shipped embedded default: CLI verify and build, loaders from outside the repo, damaged-copy detection, a light import."
import os
import shutil
import subprocess
import sys

import pytest

from conftest import run_module
from domino_research.data import read_jsonl
from domino_research.embedded import (EMBEDDED_DIR, MANIFEST_NAME, SPLITS, TARGET_DIR, embedded_dataset_path,
                                      verify_manifest)

pytestmark = pytest.mark.skipif(not (EMBEDDED_DIR / MANIFEST_NAME).exists(), reason="embedded artifacts not built")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_cli_verify():
    out = subprocess.run([sys.executable, "-m", "domino_research.embedded", "verify"], capture_output=True, text=True,
                         env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "all match MANIFEST.json" in out.stdout


def test_cli_verify_damaged_copy_is_one_error_line(tmp_path):
    copy = tmp_path / "embedded"
    shutil.copytree(EMBEDDED_DIR, copy)
    (copy / "quality.json").write_text("{}\n")
    out = subprocess.run([sys.executable, "-m", "domino_research.embedded", "verify", "--dir", str(copy)],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and "quality.json" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_import_does_not_load_the_builder():
    # ablations hashes files with sha256_file, the recipe resolves paths: neither should pay for the builder
    code = ("import sys, domino_research.embedded\n"
            "print(sorted(m for m in ('domino_research.embedded_build', 'domino_research.data', 'torch', 'transformers', "
            "'tokenizers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_cli_build(tmp_path):
    old = run_module("domino_research.embedded", "build", "--out", tmp_path / "x")            # in this process
    assert old.returncode == 2 and "python -m domino_research.embedded_build" in old.stderr, old.stderr   # says where it went
    out = run_module("domino_research.embedded_build", "-h")
    assert out.returncode == 0 and "--max_train_seconds" in out.stdout, out.stderr
    out = run_module("domino_research.embedded_build", "--out", tmp_path / "b", "--stages", "corpus,tokenizr")
    assert out.returncode == 2 and "unknown stage(s) ['tokenizr']" in out.stderr, out.stderr
    # the first two stages of the documented build, launched as documented, reproduce the shipped corpus and tokenizer
    cmd = [sys.executable, "-m", "domino_research.embedded_build"]
    out = subprocess.run(cmd + ["--out", str(tmp_path / "b"), "--stages", "corpus,tokenizer", "--threads", "1"],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr
    for s in SPLITS:
        assert read_jsonl(tmp_path / "b" / "corpus" / f"{s}.jsonl.gz") == read_jsonl(EMBEDDED_DIR / "corpus" / f"{s}.jsonl.gz")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "b" / TARGET_DIR / f).read_bytes() == (EMBEDDED_DIR / TARGET_DIR / f).read_bytes(), f


def test_loaders_from_another_directory(tmp_path):
    # An editable install imported from outside the repo is a namespace package (no __file__):
    # the loaders must still find the assets.
    code = (
        "from domino_research.embedded import load_embedded_target, embedded_mask_token_id, embedded_dataset_path\n"
        "m, t = load_embedded_target(); ids = t.apply_chat_template([{'role': 'user', 'content': 'hi'}], "
        "add_generation_prompt=True, enable_thinking=False, return_dict=False)\n"
        "print(type(m).__name__, m.dtype, t.convert_ids_to_tokens(embedded_mask_token_id()), "
        "embedded_dataset_path('test').exists(), len(m.generate(__import__('torch').tensor([ids]), max_new_tokens=3, "
        "do_sample=False)[0]) - len(ids))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:4] == ["Qwen3ForCausalLM", "torch.float32", "<|mask|>", "True"]


def test_damaged_copy_is_refused(tmp_path):
    copy = tmp_path / "embedded"
    shutil.copytree(EMBEDDED_DIR, copy)
    verify_manifest(copy)
    with open(copy / "data" / "test.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(ValueError, match="test.jsonl.*changed or damaged"):
        verify_manifest(copy)
    shutil.copy(EMBEDDED_DIR / "data" / "test.jsonl", copy / "data" / "test.jsonl")  # repaired
    verify_manifest(copy)
    (copy / "target" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        verify_manifest(copy)


def test_datasets_are_messages_form_and_module_disjoint():
    mods = {}
    for s in SPLITS:
        rows = read_jsonl(embedded_dataset_path(s))
        assert rows and all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)
        mods[s] = {r["module"] for r in rows}
    assert not (mods["train"] & mods["test"]) and not (mods["train"] & mods["validation"])
    assert not (mods["validation"] & mods["test"])
