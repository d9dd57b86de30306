"""The ``trajstore`` command line: :mod:`~trajstore.cli.main` (entry point and error handling),
:mod:`~trajstore.cli.parser` (subcommands and options), :mod:`~trajstore.cli.commands` (what each does),
:mod:`~trajstore.cli.config_file` (a run's config from a JSON or YAML file), :mod:`~trajstore.cli.interrupted` (what
an interrupted rollout kept, and how to go on), :mod:`~trajstore.cli.formats` (tables, CSV, JSON lines, Parquet for
a shell) and :mod:`~trajstore.cli.allocators` (how ``trajstore serve`` allocates memory)."""

from __future__ import annotations

from trajstore.cli.main import main

__all__ = ["main"]
