"""The trajstore service (FastAPI), installed as ``trajstore.api``: :mod:`~trajstore.api.app` builds the
application, one router per resource in :mod:`~trajstore.api.routes`, the dashboard in
:mod:`~trajstore.api.dashboard`; :mod:`~trajstore.api.params` turns query parameters into typed filters,
:mod:`~trajstore.api.problems` every error into RFC 9457 problem details. Routes only call
:class:`~trajstore.store.Store` methods."""

from __future__ import annotations

from trajstore.extras import needed

with needed("serve", "the trajstore service (trajstore.api)"):  # said once, before any route imports FastAPI
    import fastapi  # noqa: F401
