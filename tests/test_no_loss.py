"""No user file overwritten or deleted, through the command lines a user runs: `--overwrite` replaces only a folder the
recipe made (its marker, not any config.yaml), and `embedded_build` never builds over a built target unless told.
Every test snapshots the files that must survive and compares them byte for byte."""
import shutil

from conftest import run_module, write_config
from test_safety import one_line_error, snapshot
from test_train import train_here


def test_overwrite_refuses_a_users_folder_with_its_own_config_yaml(tiny, tmp_path):
    "On main this folder's other files were deleted: the check looked for any file named config.yaml."
    runs = tmp_path / "runs"
    mine = runs / "mine"
    mine.mkdir(parents=True)
    (mine / "config.yaml").write_text("learning_rate: 0.001\n")        # a user's own experiment notes
    (mine / "results.csv").write_text("step,loss\n1,2.0\n")
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(runs), "max_steps": 1})
    before = snapshot(tmp_path)
    p = train_here(cfg, "--run_name", "mine", "--overwrite", "true")
    one_line_error(p, "not a training run this recipe made", ".domino_run")
    assert snapshot(tmp_path) == before


def test_overwrite_replaces_a_run_the_recipe_made(tiny, tmp_path):
    "The marker is what makes a folder replaceable: a finished run is, and its replacement is marked in turn."
    runs = tmp_path / "runs"
    cfg = write_config(tmp_path / "c.yaml", {**tiny["base"], "output_dir": str(runs), "max_steps": 1})
    assert train_here(cfg, "--run_name", "r").returncode == 0
    assert (runs / "r" / ".domino_run").is_file()
    p = train_here(cfg, "--run_name", "r", "--overwrite", "true")
    assert p.returncode == 0, p.stderr[-3000:]
    assert (runs / "r" / ".domino_run").is_file() and not (runs / ".r.replaced").exists()


def test_embedded_build_refuses_to_replace_a_built_target(tmp_path):
    """`embedded_build --out <the shipped folder> --stages target` replaced the shipped target on main (a copy stands in
    for it here): refused in one line before any work, every file as it was."""
    from domino_research.embedded import EMBEDDED_DIR
    copy = tmp_path / "embedded"
    shutil.copytree(EMBEDDED_DIR, copy)
    before = snapshot(copy)
    for stages in ("target", "tokenizer", "corpus,regenerate"):
        p = run_module("domino_research.embedded_build", "--out", copy, "--stages", stages, "--steps", "1")
        one_line_error(p, f"--out {copy}: these --stages would replace", "pass --replace")
    assert snapshot(copy) == before
