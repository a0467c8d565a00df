"""Import ``kubernetes_asyncio`` lazily.

The package's generated ``__init__`` modules import every model (~770 classes) and every API
class (~90) up front: 0.75 s and ~70 MB of RSS on our machines, before the first request.
Our processes use raw dicts through ``ApiClient.call_api`` and never the generated models,
and the kubelet plugin runs on every Neuron node with a memory budget of 80 MB, so paying for
the whole OpenAPI surface is not acceptable there.

``install()`` puts lazy stand-ins for ``kubernetes_asyncio``, ``kubernetes_asyncio.client``,
``kubernetes_asyncio.client.models`` and ``kubernetes_asyncio.client.api`` into
``sys.modules``. Each exposes the same names as the real package ``__init__`` (read from
that file's ``from X import Y`` / ``import X as Y`` lines) and imports the defining module on
first attribute access; submodule imports work as usual because each stand-in has the real
``__path__``. Code that uses ``client.CustomObjectsApi`` or ``client.V1Pod`` keeps working
and pays only for what it touches.

If the package was imported already, or its ``__init__`` files do not look as expected (a
different generator), nothing is installed and the normal eager import is used.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Final

ROOT: Final = "kubernetes_asyncio"

_FROM_IMPORT = re.compile(r"^from\s+([\w.]+)\s+import\s+(\w+)(?:\s+as\s+(\w+))?\s*$", re.M)
_IMPORT_AS = re.compile(r"^import\s+([\w.]+)\s+as\s+(\w+)\s*$", re.M)
_VERSION = re.compile(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", re.M)


class LazyPackage(types.ModuleType):
    """A package module whose exported names are imported on first access."""

    def __init__(self, name: str, path: Path, exports: dict[str, tuple[str, str | None]]) -> None:
        super().__init__(name)
        self.__path__ = [str(path)]
        self.__file__ = str(path / "__init__.py")
        spec = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        spec.submodule_search_locations = [str(path)]
        self.__spec__ = spec
        self.__package__ = name
        # name -> (module to import, attribute in it or None for the module itself)
        self._lazy_exports = exports
        self.__all__ = [n for n in exports if not n.startswith("_")]

    def __getattr__(self, name: str) -> object:
        target = self._lazy_exports.get(name)
        if target is None:
            # A submodule not re-exported by __init__ (e.g. ``client.rest``).
            try:
                value: object = importlib.import_module(f"{self.__name__}.{name}")
            except ModuleNotFoundError:
                raise AttributeError(
                    f"module {self.__name__!r} has no attribute {name!r}"
                ) from None
        else:
            module_name, attr = target
            module = importlib.import_module(module_name)
            value = module if attr is None else getattr(module, attr)
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._lazy_exports))


def _exports(init_file: Path) -> dict[str, tuple[str, str | None]]:
    text = init_file.read_text()
    out: dict[str, tuple[str, str | None]] = {}
    for module, name, alias in _FROM_IMPORT.findall(text):
        if module == "__future__":
            continue
        out[alias or name] = (module, name)
    for module, alias in _IMPORT_AS.findall(text):
        out[alias] = (module, None)
    return out


def install() -> bool:
    """Install the lazy stand-ins; False when the package is already imported or unknown."""
    if any(m == ROOT or m.startswith(ROOT + ".") for m in sys.modules):
        return False
    spec = importlib.util.find_spec(ROOT)
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    layout = {
        ROOT: root,
        f"{ROOT}.client": root / "client",
        f"{ROOT}.client.models": root / "client" / "models",
        f"{ROOT}.client.api": root / "client" / "api",
    }
    try:
        exports = {name: _exports(path / "__init__.py") for name, path in layout.items()}
    except OSError:
        return False
    # Only take over a layout we understand: the eager import is always a correct fallback.
    if "ApiClient" not in exports[f"{ROOT}.client"] or "client" not in exports[ROOT]:
        return False
    modules = {name: LazyPackage(name, path, exports[name]) for name, path in layout.items()}
    for name, module in modules.items():
        version = _VERSION.search((layout[name] / "__init__.py").read_text())
        if version:
            module.__version__ = version.group(1)  # type: ignore[attr-defined]
    # Parents hold their children as attributes, as the import system would have set them.
    modules[ROOT].client = modules[f"{ROOT}.client"]  # type: ignore[attr-defined]
    modules[f"{ROOT}.client"].models = modules[f"{ROOT}.client.models"]  # type: ignore[attr-defined]
    modules[f"{ROOT}.client"].api = modules[f"{ROOT}.client.api"]  # type: ignore[attr-defined]
    sys.modules.update(modules)
    return True
