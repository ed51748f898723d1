"""The stages import only downstream of collect -> features -> train -> predictor -> cli: the learned models live in
models/, which train and predictor both import, so no stage reaches into a later one (the guide's "no arrow against
the flow"). Checked on the source, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "perfpredict"
# Which subpackages each may import from perfpredict; core/catalog are shared by all.
ALLOWED = {
    "core": {"core"},
    "features": {"core", "features"},
    "models": {"core", "features", "models"},
    "train": {"core", "features", "models", "train"},
    "predictor": {"core", "features", "models", "predictor"},
}
STAGES = {"core", "features", "models", "train", "predictor", "collect", "cli", "api"}
# The CLI modules inside predictor/ sit on top of the library facade (perfpredict.api), like cli.py does.
CLI_MODULES = {"cli.py", "generate_cli.py"}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perfpredict."):
            out.append((node.lineno, node.module.split(".")[1]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith("perfpredict.")]
    return out


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_no_import_against_the_flow(stage):
    bad = [f"{f.relative_to(PKG.parent)}:{line} imports perfpredict.{mod}"
           for f in sorted((PKG / stage).rglob("*.py")) for line, mod in _imports(f)
           if mod in STAGES and mod not in ALLOWED[stage] and not (f.name in CLI_MODULES and mod == "api")]
    assert not bad, "\n".join(bad)
