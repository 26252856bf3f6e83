"""Subcommands of the ``fastqa`` command, one module per area; each exposes ``register(subparsers)``.

Modules import the heavy parts (spaCy, the models) inside their run functions, so ``fastqa --help`` is quick.
"""
import importlib

COMMAND_MODULES = []
for _name in ("qa", "mt"):
    try:  # TODO(lead): plain imports once both areas have landed
        COMMAND_MODULES.append(importlib.import_module(f".{_name}", __name__))
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_name}":
            raise

__all__ = ["COMMAND_MODULES"]
