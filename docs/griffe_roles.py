"""A Griffe extension for the docs site: the Sphinx roles in trajstore's docstrings shown as code.

The docstrings name other objects the Sphinx way (``:class:`~trajstore.errors.InputError```, ``:meth:`Store.sql
<trajstore.store.Store.sql>```); mkdocstrings renders Markdown, where such a role would show as text. Each one becomes
a code span of what Sphinx would show: the last part of the path after ``~``, the title before ``<…>``, else the path.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|exc|data|obj):`(~?)([^`<]+?)\s*(?:<([^>`]+)>)?`")


def shown(match: re.Match[str]) -> str:
    """The code span Sphinx would show for one role."""
    tilde, text, target = match.groups()
    if target:
        return f"`{text}`"
    return f"`{text.rsplit('.', 1)[-1]}`" if tilde else f"`{text}`"


class SphinxRoles(griffe.Extension):
    """Rewrites every loaded object's docstring once, before mkdocstrings parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(shown, obj.docstring.value)
