"Every notebook opens in Jupyter and runs under papermill as it is: a kernelspec naming the environment's kernel."
import json

from conftest import REPO


def test_every_notebook_names_its_kernel():
    kernels = {p.name: json.loads(p.read_text())["metadata"].get("kernelspec", {}).get("name")
               for p in sorted((REPO / "nbs").glob("*.ipynb"))}
    assert len(kernels) > 20 and all(k == "python3" for k in kernels.values()), kernels
