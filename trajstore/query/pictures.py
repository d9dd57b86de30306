"""Which observations are pictures, and each step's picture: what the dashboard shows and exports store as images.

An observation leaf (the ``obs`` column, or a leaf of a Dict observation by its path, ``obs.pixels``) is a
picture when one step's frame is 2-D ``(H, W)`` (gray), or 3-D with its channels last ``(H, W, C)`` or first
``(C, H, W)``, C being 1 (gray), 3 (RGB) or 4 (RGBA), and H and W at least :data:`MIN_SIDE`. A leaf declared as a
frame stack (``frame_stack={"obs": k}``: ``(k, *frame)``, newest frame last) shows its newest frame. A 3-D frame
with neither axis a channel count (``(4, 84, 84)``: gymnasium's ``FrameStackObservation`` of gray frames, not
declared) is read as a stack of gray frames, newest last. Channels are read last when the last axis can be a
channel count, first otherwise (``(3, 64, 64)`` is CHW, ``(64, 64, 3)`` HWC).

A picture is ``uint8`` ``(H, W)`` or ``(H, W, C)``. ``uint8`` frames are shown as stored; bool as 0/255; other
numbers scaled linearly: floats within [0, 1] by 255, anything else from the frame's own minimum and maximum to
0..255 (a constant frame is black).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.schema import leaf_of_type
from trajstore.storage.encoding import OBS, leaves

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

MIN_SIDE = 8  # a frame's height and width at least this: (4, 3) is a small matrix, not a picture
CHANNELS = (1, 3, 4)


@dataclass(frozen=True)
class ImageLeaf:
    """One observation leaf that is a picture: where it is and how one step of it becomes a picture."""

    path: str  # "obs", or "obs.pixels" in a Dict observation
    shape: tuple[int, ...]  # one step's shape, as stored
    dtype: np.dtype
    stack: int | None  # frames along the first axis (newest last), or None
    axes: str  # "hw", "hwc" or "chw": how one frame's axes are ordered

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self.shape[1:] if self.stack else self.shape

    @property
    def height(self) -> int:
        f = self.frame_shape
        return f[1] if self.axes == "chw" else f[0]

    @property
    def width(self) -> int:
        f = self.frame_shape
        return f[2] if self.axes == "chw" else f[1]

    @property
    def channels(self) -> int:
        f = self.frame_shape
        return 1 if self.axes == "hw" else f[0] if self.axes == "chw" else f[2]

    def describe(self) -> dict[str, object]:
        """What a client needs to show it (JSON)."""
        return {"leaf": self.path, "shape": list(self.shape), "dtype": self.dtype.name, "stack": self.stack,
                "height": self.height, "width": self.width, "channels": self.channels}

    def picture(self, step: np.ndarray) -> np.ndarray:
        """One step of this leaf (an array of :attr:`shape`) as a ``uint8`` picture, ``(H, W)`` for gray (one
        channel) or ``(H, W, C)``."""
        x = np.asarray(step)
        if x.shape != self.shape:
            raise InputError(f"{self.path}: expected a step of shape {self.shape}, got {x.shape}")
        if self.stack:
            x = x[-1]
        if self.axes == "chw":
            x = np.moveaxis(x, 0, -1)
        if x.ndim == 3 and x.shape[-1] == 1:
            x = x[..., 0]
        return to_uint8(x)


def to_uint8(x: np.ndarray) -> np.ndarray:
    """``x`` as ``uint8`` pixel values (see the module's description)."""
    if x.dtype == np.uint8:
        return x
    if x.dtype == np.bool_:
        return x.astype(np.uint8) * np.uint8(255)
    values = x.astype(np.float64)
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    if np.issubdtype(x.dtype, np.floating) and lo >= 0.0 and hi <= 1.0:
        lo, hi = 0.0, 1.0
    scaled = np.zeros_like(values) if hi <= lo else (np.nan_to_num(values, nan=lo) - lo) * (255.0 / (hi - lo))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def image_leaf(path: str, shape: tuple[int, ...], dtype: np.dtype, stack: int | None = None) -> ImageLeaf | None:
    """The picture view of a leaf of one step's ``shape`` and ``dtype`` (``stack``: declared frame stack),
    or None if it is not a picture."""
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_) or np.issubdtype(dtype, np.complexfloating):
        return None
    frame = shape[1:] if stack else shape

    def big(h: int, w: int) -> bool:
        return h >= MIN_SIDE and w >= MIN_SIDE

    if len(frame) == 2 and big(*frame):
        return ImageLeaf(path, shape, dtype, stack, "hw")
    if len(frame) != 3:
        return None
    if frame[2] in CHANNELS and big(frame[0], frame[1]):
        return ImageLeaf(path, shape, dtype, stack, "hwc")
    if frame[0] in CHANNELS and big(frame[1], frame[2]):
        return ImageLeaf(path, shape, dtype, stack, "chw")
    if not stack and big(frame[1], frame[2]):  # an undeclared stack of gray frames
        return ImageLeaf(path, shape, dtype, frame[0], "hw")
    return None


def image_leaves(obs: pa.DataType, frame_stack: Mapping[str, int] | None = None) -> list[ImageLeaf]:
    """The leaves of an observation of (logical) Arrow type ``obs`` that are pictures, in leaf order
    (``frame_stack``: the declared stacks, leaf path -> k)."""
    stacks = dict(frame_stack or {})
    out = []
    for path, t in leaves(obs, OBS):
        leaf = leaf_of_type(t)
        if -1 in leaf.shape:
            continue
        found = image_leaf(path, leaf.shape, leaf.dtype, stacks.get(path))
        if found is not None:
            out.append(found)
    return out


def leaf_values(column: pa.Array, path: str) -> pa.Array:
    """The values of leaf ``path`` (``obs.pixels``) in an ``obs`` column (the column itself for ``obs``)."""
    for name in path.split(".")[1:]:
        column = column.field(name)
    return column


def png(picture: np.ndarray, size: int | None = None) -> bytes:
    """``picture`` (``uint8`` ``(H, W)`` or ``(H, W, C)``) as PNG bytes, its longer side scaled to ``size``
    pixels (aspect kept; nearest neighbour when enlarging, so pixels stay sharp; box-filtered when reducing)."""
    with needed("lerobot", "a picture as PNG (LeRobot's image features, the dashboard's frames)"):
        from PIL import Image

    img = Image.fromarray(picture)
    if size is not None:
        h, w = picture.shape[:2]
        scale = size / max(h, w)
        target = (max(1, round(w * scale)), max(1, round(h * scale)))
        if target != (w, h):
            img = img.resize(target, Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BOX)
    out = io.BytesIO()
    img.save(out, format="PNG", compress_level=1)
    return out.getvalue()


def stored_image_leaves(engine: Engine, env_id: str | None = None) -> list[ImageLeaf]:
    """The observation leaves of a store that are pictures (of one environment's files with ``env_id``), their
    declared frame stacks taken from the files' formats; empty without images."""
    schema = engine.stored_schema(env_id) or pa.schema([])
    if OBS not in schema.names:
        return []
    stacks: dict[str, int] = {}
    files = [f for f in engine.files() if env_id is None or f.env_id == env_id]
    for stored in engine.file_schemas(files):
        stacks.update(stored.format.stacks)
    return image_leaves(schema.field(OBS).type, stacks)
