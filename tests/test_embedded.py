"The shipped embedded default: CLI verify, loaders from outside the repo, damaged-copy detection."
import json
import os
import shutil
import subprocess
import sys

import pytest

from domino_research.embedded import (EMBEDDED_DIR, MANIFEST_NAME, SPLITS, embedded_dataset_path, read_jsonl,
                                      verify_manifest)

pytestmark = pytest.mark.skipif(not (EMBEDDED_DIR / MANIFEST_NAME).exists(), reason="embedded artifacts not built")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_cli_verify():
    out = subprocess.run([sys.executable, "-m", "domino_research.embedded", "verify"], capture_output=True, text=True,
                         env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "all match MANIFEST.json" in out.stdout


def test_loaders_from_another_directory(tmp_path):
    # An editable install imported from outside the repo is a namespace package (no __file__): the loaders must still find the assets.
    code = ("from domino_research.embedded import load_embedded_target, embedded_mask_token_id, embedded_dataset_path\n"
            "m, t = load_embedded_target(); ids = t.apply_chat_template([{'role': 'user', 'content': 'hi'}], "
            "add_generation_prompt=True, enable_thinking=False, return_dict=False)\n"
            "print(type(m).__name__, m.dtype, t.convert_ids_to_tokens(embedded_mask_token_id()), "
            "embedded_dataset_path('test').exists(), len(m.generate(__import__('torch').tensor([ids]), max_new_tokens=3, do_sample=False)[0]) - len(ids))")
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
