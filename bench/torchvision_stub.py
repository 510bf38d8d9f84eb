"""An import stub for `torchvision`, for scripts that run in SGLang's own virtualenv.

PyPI's torchvision cannot load beside the CPU build of torch, and SGLang imports it only from
multimodal modules that neither the radix cache nor `bench_serving` call. The stub answers
only real import statements: transformers probes `importlib.util.find_spec("torchvision")` to
decide whether to use torchvision's API, and must keep seeing that it is absent.

Standard library only: it runs in SGLang's virtualenv, never imports the project.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence


class TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answer ``import torchvision`` (and its submodules) with empty modules."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchvision" and not fullname.startswith("torchvision."):
            return None
        # Frame 1 is importlib's _find_spec; frame 2 is the import machinery for an import
        # statement and importlib.util.find_spec for an availability probe.
        if sys._getframe(2).f_code.co_name != "_find_and_load_unlocked":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the stub module stays empty."""


def install() -> None:
    """Put the stub first on the import path (once)."""
    if not any(isinstance(finder, TorchvisionStub) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionStub())
