"""The dashboard: one web page over the public API, with Plotly.js served from the installed package."""

from __future__ import annotations

from trajstore.api.dashboard.routes import router

__all__ = ["router"]
