"Every notebook opens in Jupyter and runs under papermill as it is: a kernelspec naming the environment's kernel."
import json

from conftest import REPO


def test_every_notebook_names_its_kernel():
    kernels = {p.name: json.loads(p.read_text())["metadata"].get("kernelspec", {}).get("name")
               for p in sorted((REPO / "nbs").glob("*.ipynb"))}
    assert len(kernels) > 20 and all(k == "python3" for k in kernels.values()), kernels


def test_fault_table_names_tests_that_exist():
    "Every test the README's fault table names is a test function in tests/ (a renamed test must update the table)."
    import re
    readme = (REPO / "README.md").read_text()
    table = readme.split("### Faults and the tests that cover them", 1)[1].split("\n## ", 1)[0]
    named, file = [], None
    for f, name in re.findall(r"`(test_\w+\.py)?(?:::(\w+))?`", table):
        if not (f or name): continue                # another code span (`state.pt`, a key)
        file = f or file                            # `::test_x` continues the file named before it
        named.append((file, name))
    assert len(named) > 30, named
    for file, name in named:
        text = (REPO / "tests" / file).read_text()
        assert not name or f"def {name}(" in text, f"README fault table: tests/{file} has no {name}"
