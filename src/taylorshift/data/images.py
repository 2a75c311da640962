"""An image folder per split, for the Vision Transformers (ImageNet layout).

Files: ``path/train/<class>/<image>``, ``path/val/<class>/<image>``,
``path/test/<class>/<image>`` (``path`` may also be one split's folder itself). Classes
are the sub-folder names in sorted order, taken from ``path/train`` when it exists, so
every split uses the same ids; the dataset exposes ``classes`` and ``class_to_idx``.
Images with the extensions in ``IMAGE_EXTENSIONS`` are read with Pillow
(``pip install pillow``) and converted to RGB.

Transform (evaluation style, no augmentation): resize so that the shorter side is
``image_size`` (bilinear, antialiased), crop the centre ``image_size`` x ``image_size``,
scale the pixels to [0, 1], then normalise per channel, ``(x - mean) / std`` (default:
the ImageNet statistics; ``mean=None, std=None`` keeps [0, 1]).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .._validate import check_choice, check_int
from ._common import SPLITS, require_path

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "IMAGE_EXTENSIONS", "ImageFolderDataset"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pil():
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "the image-folder task reads images with Pillow, which is not installed: "
            "pip install pillow"
        ) from err
    return Image


def _classes(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _channel_stats(name: str, value) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3:
        raise ValueError(f"{name} must be None or 3 numbers (R, G, B), got {value!r}")
    stats = torch.tensor([float(v) for v in value]).view(3, 1, 1)
    if name == "std" and not bool((stats > 0).all()):
        raise ValueError(f"std must be 3 positive numbers, got {value!r}")
    return stats


class ImageFolderDataset(Dataset):
    """Images of class sub-folders: ``(image (3, S, S) float, label)``.

    Args:
        path: a folder with ``train``/``val``/``test`` sub-folders, or one split's folder.
        split: ``"train"``, ``"val"`` or ``"test"``.
        image_size: side S of the square output.
        mean, std: per-channel normalisation after scaling to [0, 1]; both None to skip.
    """

    def __init__(
        self,
        split: str = "train",
        *,
        path=None,
        image_size: int = 224,
        mean: Sequence[float] | None = IMAGENET_MEAN,
        std: Sequence[float] | None = IMAGENET_STD,
    ) -> None:
        check_choice("split", split, SPLITS)
        root = require_path("image-folder", path)
        self.image_size = check_int("image_size", image_size, ge=1)
        self.mean, self.std = _channel_stats("mean", mean), _channel_stats("std", std)
        if (self.mean is None) != (self.std is None):
            raise ValueError(f"mean and std must both be given or both None, got {mean}, {std}")
        _pil()
        folder = root / split if (root / split).is_dir() else root
        if not root.is_dir():
            raise ValueError(f"path must be a folder of class folders, got the file {str(root)!r}")
        reference = root / "train" if (root / "train").is_dir() else folder
        self.classes = _classes(reference)
        if not self.classes:
            raise ValueError(f"path must hold one sub-folder per class, got none in {reference}")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        unknown = [c for c in _classes(folder) if c not in self.class_to_idx]
        if unknown:
            raise ValueError(
                f"{folder}: class folders must be among the training classes {self.classes}, "
                f"got {unknown}"
            )
        self.samples: list[tuple[Path, int]] = [
            (file, self.class_to_idx[c])
            for c in _classes(folder)
            for file in sorted((folder / c).rglob("*"))
            if file.suffix.lower() in IMAGE_EXTENSIONS and file.is_file()
        ]
        if not self.samples:
            raise ValueError(
                f"path must hold images ({', '.join(IMAGE_EXTENSIONS)}) in class folders, got "
                f"none in {folder}"
            )
        self.num_classes = len(self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, file: Path) -> torch.Tensor:
        """One image file as the model's input: float (3, S, S)."""
        image = _pil()
        with image.open(file) as img:
            img = img.convert("RGB")
            w, h = img.size
            scale = self.image_size / min(w, h)
            size = (max(self.image_size, round(w * scale)), max(self.image_size, round(h * scale)))
            img = img.resize(size, image.Resampling.BILINEAR)
            left, top = (size[0] - self.image_size) // 2, (size[1] - self.image_size) // 2
            img = img.crop((left, top, left + self.image_size, top + self.image_size))
            pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = pixels.view(self.image_size, self.image_size, 3).permute(2, 0, 1).float() / 255
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        file, label = self.samples[index]
        return self.load(file), label
