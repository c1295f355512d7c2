"""SGLang on a CPU-only machine: its Python classes, installed without its CUDA dependencies.

SGLang's configuration package imports ``torchvision.transforms`` for its image-model configs when it is imported.
The registry's torchvision wheels are CUDA builds that cannot load next to the CPU torch these tests use, and no
text-model path touches torchvision; so when torchvision cannot be imported, transformers' (cached) availability
check runs first and finds none, and a module holding only the two names SGLang reads at import
(``InterpolationMode``) stands in for ``torchvision.transforms``. The test modules skip without SGLang.
"""

from __future__ import annotations

import enum
import importlib.machinery
import sys
import types


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
    return module


def _stand_in_for_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except ImportError:
        pass
    try:
        import transformers.utils.import_utils as transformers_imports
    except ImportError:
        return
    if transformers_imports.is_torchvision_available():  # cached from here on
        return
    root, transforms, functional = (_module("torchvision"), _module("torchvision.transforms"),
                                    _module("torchvision.transforms.functional"))
    functional.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC")  # type: ignore[attr-defined]
    transforms.InterpolationMode = functional.InterpolationMode  # type: ignore[attr-defined]
    transforms.functional = functional  # type: ignore[attr-defined]
    root.transforms = transforms  # type: ignore[attr-defined]


_stand_in_for_torchvision()
