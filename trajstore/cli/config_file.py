"""A run's config from a file (``--config-file``): JSON, or YAML read without letting its aliases blow up.

A YAML alias (``*name``) repeats the value its anchor (``&name``) names without copying it, so nine lines of nested
aliases stand for billions of values (342 bytes took 105 s and 1.3 GB before they were refused). PyYAML builds the
aliased value once and shares it; it is every reader after it that expands it. So the file is composed into YAML's
node graph first, the size it expands to is counted over that graph (each node once, its expanded size remembered),
and the config is built only when it stays within a run config's bounds
(:data:`~trajstore.storage.run_config.MAX_DEPTH` levels, about :data:`~trajstore.storage.run_config.MAX_CONFIG_BYTES`
of values); an alias that refers to itself is refused too. Anchors and aliases within those bounds work as YAML says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.storage.run_config import MAX_CONFIG_BYTES, MAX_DEPTH

if TYPE_CHECKING:
    import yaml

MAX_FILE_BYTES = 8 * MAX_CONFIG_BYTES  # a config file (comments, layout) larger than that is not read
MAX_VALUES = MAX_CONFIG_BYTES // 2  # each value takes at least two bytes of JSON text ("1,")


def load(path: Path) -> dict[str, Any]:
    """The mapping of names to values in the JSON or YAML file at ``path`` (JSON for a ``.json`` name); anything
    else, or a file past the bounds of the module, is an :class:`InputError` naming ``--config-file``."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"--config-file: {path} has {path.stat().st_size} bytes; a config file has at most "
                             f"{MAX_FILE_BYTES}")
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"--config-file: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"--config-file: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        loaded = json.loads(text) if path.suffix.lower() == ".json" else _yaml(text, path)
    except RecursionError:
        raise InputError(f"--config-file: {path} nests deeper than a config may ({MAX_DEPTH} levels)") from None
    except InputError:  # past a bound, or a missing extra: said as it is
        raise
    except ValueError as exc:
        raise InputError(f"--config-file: {path} is not JSON or YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, dict):
        raise InputError(f"--config-file: {path} holds a {type(loaded).__name__}; expected a mapping of names to "
                         "values")
    return loaded


def _yaml(text: str, path: Path) -> Any:
    """The value of a YAML document, built once its node graph is known to expand within the bounds (a
    ``ValueError`` where it is not YAML)."""
    with needed("yaml", f"--config-file: {path}, read as YAML (its name does not end in .json),"):
        import yaml
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded(node, path, {}, set(), 0)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None
    finally:
        loader.dispose()


def _expanded(node: yaml.Node, path: Path, sizes: dict[int, int], open_: set[int], depth: int) -> int:
    """How many values ``node`` stands for once every alias in it is expanded (``sizes``: those of the nodes
    counted already; ``open_``: the nodes being counted, an alias to one of which refers to itself)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise InputError(f"--config-file: {path}: an alias refers to the value that holds it ({node.start_mark})")
    if depth > MAX_DEPTH:
        raise InputError(f"--config-file: {path} nests deeper than a config may ({MAX_DEPTH} levels)")
    open_.add(id(node))
    import yaml

    children = node.value if isinstance(node, yaml.SequenceNode) else \
        [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
    size = 1 + sum(_expanded(child, path, sizes, open_, depth + 1) for child in children)
    open_.discard(id(node))
    if size > MAX_VALUES:
        raise InputError(f"--config-file: {path} expands to more than {MAX_VALUES} values (its YAML aliases repeat "
                         f"values: an alias bomb?); a config takes at most {MAX_CONFIG_BYTES} bytes")
    sizes[id(node)] = size
    return size
