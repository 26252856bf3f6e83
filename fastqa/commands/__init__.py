"""Subcommands of the ``fastqa`` command, one module per area; each exposes ``register(subparsers)``.

Modules import the heavy parts (spaCy, the models) inside their run functions, so ``fastqa --help`` is quick.
"""
from . import mt, qa

COMMAND_MODULES = [qa, mt]

__all__ = ["COMMAND_MODULES"]
