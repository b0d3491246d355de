"""Names in a module's `__all__` that nothing else uses: per module, how many public names are used by no other module,
test, notebook of another module, run script, README or docs (a word match over every tracked text file, notebooks'
cell sources only, the module's own .py and notebooks left out). A public name used nowhere else is a helper: it
belongs out of `__all__` (nbdev's `#| exporti`). Not a test (a word match also counts a same-named local variable as a
use, so the count is a floor): run it to see the numbers.

    python tests/unused_public_names.py                 # a count per module
    python tests/unused_public_names.py decode bench    # and the names, for these modules
"""
import ast, json, re, subprocess, sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (".py", ".ipynb", ".md", ".sh", ".yaml", ".yml", ".toml", ".ini", ".cfg")


def public_names(py: Path) -> list[str]:
    "The names of `__all__` in a generated module."
    for node in ast.parse(py.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def source_text(path: Path) -> str:
    "A file's text; of a notebook, its cells' sources only (outputs of an executed record are no use of a name)."
    if path.suffix != ".ipynb": return path.read_text(errors="replace")
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])


def own_notebooks(module: str) -> set[str]:
    "The notebooks a module is generated from (its `#| default_exp`)."
    return {str(p.relative_to(REPO)) for p in (REPO / "nbs").glob("*.ipynb")
            if re.search(rf"#\|\s*default_exp\s+{module}\b", p.read_text())}


def unused(modules=None) -> dict[str, list[str]]:
    "{module: its public names used nowhere but in its own .py and notebooks}."
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    texts = {f: source_text(REPO / f) for f in files if f.endswith(TEXT) and (REPO / f).is_file()
             and f != "domino_research/_modidx.py"}
    words = {f: set(re.findall(r"\w+", t)) for f, t in texts.items()}
    out = {}
    for py in sorted((REPO / "domino_research").glob("*.py")):
        m = py.stem
        if m.startswith("_") or (modules and m not in modules): continue
        mine = own_notebooks(m) | {f"domino_research/{m}.py"}
        elsewhere = set().union(*(words[f] for f in words if f not in mine))
        out[m] = [n for n in public_names(py) if n not in elsewhere]
    return out


if __name__ == "__main__":
    names = sys.argv[1:]
    found = unused(set(names) or None)
    total = 0
    for m, gone in found.items():
        n = len(public_names(REPO / "domino_research" / f"{m}.py"))
        total += len(gone)
        print(f"{m:16s} {n:4d} public, {len(gone):3d} used nowhere else" + (f": {', '.join(gone)}" if names else ""))
    print(f"{'all':16s} {sum(len(public_names(p)) for p in (REPO / 'domino_research').glob('[!_]*.py')):4d} public, "
          f"{total:3d} used nowhere else")
