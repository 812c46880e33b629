"""One type holds generation settings: no class of clarifyjax/ or sage_jax/ but
`text.generator.Sampling` declares two or more of the sampling fields (a type that needs them
holds a `Sampling` instead)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"temperature", "top_k", "top_p", "max_new_tokens", "min_new_tokens"}


def declared(cls: ast.ClassDef) -> set[str]:
    """The names a class body assigns (fields of a dataclass or NamedTuple, class attributes)."""
    names = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def classes_with_sampling_fields(root: Path) -> list[str]:
    found = []
    for package in ("clarifyjax", "sage_jax"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and len(declared(node) & FIELDS) >= 2:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


def test_only_sampling_declares_the_sampling_fields():
    found = classes_with_sampling_fields(ROOT)
    assert [f.partition(":")[0] + " " + f.split()[-1] for f in found] == [
        "clarifyjax/text/generator.py Sampling"], found


def test_the_check_finds_a_second_class(tmp_path):
    (tmp_path / "clarifyjax").mkdir()
    (tmp_path / "sage_jax").mkdir()
    (tmp_path / "sage_jax" / "config.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass Settings:\n"
        "    temperature: float = 1.0\n    top_p: float = 1.0\n    name: str = ''\n")
    assert classes_with_sampling_fields(tmp_path) == ["sage_jax/config.py:4 Settings"]
