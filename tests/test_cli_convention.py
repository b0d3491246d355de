"""One command-line convention for every command (notebook 09), in-process: `--help` lists every key with its default,
a boolean is `--flag` or `--flag true|false`, an unknown or renamed key is one `error:` line and exit status 2."""
import re

import pytest

from conftest import write_config


def _exit(capsys, parse, argv) -> tuple[int, str, str]:
    "Exit status, stdout and stderr of a command line that stops (`--help`, a refusal)."
    with pytest.raises(SystemExit) as e: parse(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _one_error_line(code, err) -> str:
    lines = [l for l in err.splitlines() if "error: " in l]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_train_help_lists_every_key_with_the_configs_default(capsys):
    import dataclasses
    from domino_research.train import cli
    from domino_research.train_config import DominoTrainConfig
    code, out, _ = _exit(capsys, cli, ["--config", "embedded_domino", "--help"])
    flat = " ".join(out.split())
    assert code == 0
    for f in dataclasses.fields(DominoTrainConfig): assert f"--{f.name} " in flat, f.name
    # the comment, its range and the config's value, not the class's 256
    assert "E, rank of the logit correction; >= 1 (default: 64)" in flat, flat
    code, out, _ = _exit(capsys, cli, ["--help"])                   # without --config: the dataclass defaults
    assert code == 0 and "(default: 0.0006)" in " ".join(out.split())


def test_regenerate_and_bench_help_show_defaults(capsys):
    from domino_research.bench import main as bench
    from domino_research.regenerate import _parse_args
    _, out, _ = _exit(capsys, _parse_args, ["--help"])
    flat = " ".join(out.split())
    assert re.search(r"--max_new_tokens MAX_NEW_TOKENS [^-]*\(default: 512\)", flat), flat       # the function's defaults
    assert re.search(r"--batch_size BATCH_SIZE [^(]*\(with --server: rows per fsync\) \(default: 8\)", flat), flat
    _, out, _ = _exit(capsys, bench, ["decode", "--help"])
    assert "--max_new_tokens MAX_NEW_TOKENS new tokens decoded per prompt (default: 128)" in " ".join(out.split())


def test_a_flag_alone_or_with_true_false_in_two_commands():
    from domino_research.regenerate import _parse_args
    from domino_research.train_config import parse_train_args
    assert parse_train_args(["--config", "x.yaml", "--enable_thinking", "--max_steps", "1"]) == \
        ("x.yaml", {"enable_thinking": True, "max_steps": 1})
    assert parse_train_args(["--enable_thinking", "false"])[1] == {"enable_thinking": False}
    base = ["--out", "o.jsonl"]
    assert _parse_args(base + ["--enable_thinking"]).enable_thinking is True
    assert _parse_args(base + ["--enable_thinking", "true"]).enable_thinking is True
    assert _parse_args(base + ["--enable_thinking", "false", "--batch_size", "2"]).enable_thinking is False
    assert _parse_args(base).enable_thinking is False


@pytest.mark.parametrize(
    "command, argv, says",
    [
        ("train", ["--config", "embedded_domino", "--blok_size", "4"], "unknown key --blok_size; did you mean --block_size?"),
        (
            "train",
            ["--config", "embedded_domino", "--decode_eval_prompts", "2"],
            "--decode_eval_prompts was renamed to --n_eval_prompts",
        ),
        ("bench", ["decode", "--max_new_token", "4"], "unknown key --max_new_token; did you mean --max_new_tokens"),
        ("bench", ["decode", "--n_prompts", "4"], "--n_prompts was renamed to --n_eval_prompts"),
        # a key of another subcommand is unknown here, and never suggested as itself
        ("bench", ["memory", "--target", "x"], "unknown key --target; did you mean --shard_target?"),
        ("regenerate", ["--out", "o.jsonl", "--enable_thinking", "maybe"], "argument --enable_thinking: expected true or false"),
    ],
)
def test_unknown_renamed_or_bad_keys_are_one_line(capsys, command, argv, says):
    from domino_research.bench import main as bench
    from domino_research.regenerate import _parse_args as regenerate
    from domino_research.train import cli as train
    line = _one_error_line(*_exit(capsys, {"train": train, "bench": bench, "regenerate": regenerate}[command], argv)[::2])
    assert says in line, line


def test_a_renamed_yaml_key_names_its_new_name(tiny, tmp_path, capsys):
    from domino_research.train import cli
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(tmp_path / "runs"), "decode_eval_prompts": 2})
    line = _one_error_line(*_exit(capsys, cli, ["--config", str(cfg)])[::2])
    assert f"{cfg}: key 'decode_eval_prompts' was renamed to 'n_eval_prompts'" in line, line
    assert not (tmp_path / "runs").exists()


# every command and subcommand a user runs, as (module entry, argv before --help)
COMMANDS = [("train", "cli", ["--config", "embedded_domino"]), ("train", "cli", []),
            *[("bench", "main", [sub]) for sub in ("loss", "decode", "data", "memory")],
            ("regenerate", "_parse_args", []), ("data", "main", ["build"]), ("embedded", "main", ["verify"]),
            ("embedded_build", "main", []), ("gpu_check", "_parse_args", [])]


@pytest.mark.parametrize("module, entry, argv", COMMANDS, ids=lambda x: x if isinstance(x, str) else " ".join(x) or "-")
def test_every_help_teaches(capsys, module, entry, argv):
    """Every command's --help: a description of its own (no docstring), every option explained, a default shown once and
    never `None`, `(required)` for a required option, and no word cut at a line break."""
    import importlib
    code, out, _ = _exit(capsys, getattr(importlib.import_module(f"domino_research.{module}"), entry), argv + ["--help"])
    assert code == 0
    head, _, options = out.partition("options:")
    description = head.split("\n\n", 1)[1] if "\n\n" in head else ""
    assert description.strip() and "`" not in description and "Returns" not in description, f"no description:\n{out}"
    entries = re.split(r"\n  (?=-)", options)[1:]                    # one entry per option
    assert entries, out
    for entry in entries:
        flag, _, text = entry.strip().partition(" ")
        text = " ".join(text.split())
        if flag in ("-h,", "-h"): continue
        assert re.search(r"[a-z]{3}", text.split("(default")[0]), f"{flag} has no description: {entry!r}"
        assert text.count("(default") <= 1 and "(default: None)" not in text, f"{flag}: {entry!r}"
    words = set(re.findall(r"[A-Za-z_]{4,}", " ".join(out.split())))
    for line in out.splitlines():                                     # a word cut at the end of a line leaves a fragment
        tail = re.search(r"([A-Za-z_]{2,})$", line)
        nxt = out.splitlines()[out.splitlines().index(line) + 1] if line != out.splitlines()[-1] else ""
        head2 = re.match(r"\s*([a-z_]{2,})", nxt)
        if tail and head2 and (tail[1] + head2[1]) in words and tail[1] not in words: pytest.fail(f"cut word: {line!r}")
