import builtins
import sys

import pytest


@pytest.fixture
def no_torch(monkeypatch):
    """Make `import torch` fail, to prove a code path needs none."""
    real_import = builtins.__import__
    for name in list(sys.modules):
        if name == "torch" or name.startswith("torch."):
            monkeypatch.delitem(sys.modules, name)

    def fake_import(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is hidden by the no_torch fixture")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    yield
