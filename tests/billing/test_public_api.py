from __future__ import annotations

from inference_auctions import billing


def test_all_is_sorted_and_complete() -> None:
    names = billing.__all__
    # isort-style order, as ruff keeps it: constants, then classes, then functions.
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    assert len(set(names)) == len(names)
    for name in names:
        assert getattr(billing, name) is not None


FORBIDDEN = ("inference_auctions.server", "inference_auctions.sdk")


def test_the_billing_package_imports_neither_server_nor_sdk() -> None:
    import ast
    from pathlib import Path

    root = Path(billing.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(FORBIDDEN), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(FORBIDDEN) for a in node.names), path
