"""Exports: a store's episodes written as datasets of other tools. :mod:`~trajstore.export.episodes` (what every
export reads: the selection pinned to one version, laid out episode-major), :mod:`~trajstore.export.target` (a
staging folder renamed into place when complete), :mod:`~trajstore.export.minari` (a local Minari dataset),
:mod:`~trajstore.export.lerobot` (a LeRobot dataset, format v3.0) and :mod:`~trajstore.export.lerobot_stats`
(LeRobot's statistics, computed while streaming)."""
