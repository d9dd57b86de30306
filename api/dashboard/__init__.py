"""The dashboard: one web page over the public API, its assets (Plotly.js vendored) served compressed."""

from __future__ import annotations

from trajstore.api.dashboard.routes import router

__all__ = ["router"]
