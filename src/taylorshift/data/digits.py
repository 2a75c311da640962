"""Real handwritten digits as pixel sequences: LRA's Image task on data every machine has.

The images are scikit-learn's bundled copy of the UCI handwritten digits (1,797 images of
8 x 8 pixels with 17 gray levels 0-16, 10 classes; ``sklearn.datasets.load_digits``, a
file inside the scikit-learn package, so nothing is downloaded). Each image is scaled to
0-255, upsampled to ``image_size`` x ``image_size`` by bilinear interpolation (half-pixel
centres, as ``torch.nn.functional.interpolate(..., align_corners=False)``; a constant image
stays constant and the corner pixels keep their values), rounded to 8-bit gray levels and
read in row-major order: a sequence of ``image_size²`` tokens (1,024 at the default 32)
with a vocabulary of 256, the shape of LRA's CIFAR-10 pixel task.

Splits: a random permutation of the 1,797 images drawn from ``split_seed`` gives the last
``test_size`` images to "test", the ``val_size`` before them to "val" and the rest to
"train". The same ``split_seed`` always gives the same parts, whatever the training seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .._validate import check_choice, check_int
from ._common import SPLITS
from .vocab import PIXEL_VOCAB_SIZE

__all__ = ["DIGITS_COUNT", "DigitsDataset", "load_digit_images", "upsample_gray"]

DIGITS_COUNT = 1797  # images in scikit-learn's bundled copy
_DIGIT_LEVELS = 16  # pixel values are 0..16


def load_digit_images() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits: images uint8 (1797, 8, 8) with values 0-16, labels long (1797,).

    Raises:
        ImportError: scikit-learn is missing (``pip install 'taylorshift[digits]'``).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError(
            "task 'digits' reads scikit-learn's bundled digits, and scikit-learn is not "
            "installed: pip install 'taylorshift[digits]' (or pip install scikit-learn)"
        ) from err
    bunch = load_digits()
    images = torch.as_tensor(bunch.images).round().to(torch.uint8)
    labels = torch.as_tensor(bunch.target, dtype=torch.long)
    return images, labels


def upsample_gray(images: torch.Tensor, size: int) -> torch.Tensor:
    """8-bit gray images (N, h, w) with values 0-16 as (N, size, size) uint8 in 0-255.

    Values are scaled by 255/16, interpolated bilinearly (half-pixel centres) and rounded
    half to even; ``size`` equal to the input side only rescales the levels.
    """
    scaled = images.to(torch.float64) * (255.0 / _DIGIT_LEVELS)
    if images.shape[-1] != size or images.shape[-2] != size:
        scaled = F.interpolate(
            scaled[:, None], size=(size, size), mode="bilinear", align_corners=False
        )[:, 0]
    return scaled.round().clamp(0, 255).to(torch.uint8)


class DigitsDataset(Dataset):
    """Handwritten digits as gray pixel sequences: ``(tokens (image_size²,) long, label)``.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"`` (see the module docs).
        image_size: side of the upsampled square image (8 keeps the original pixels).
        val_size, test_size: images held out for validation and test.
        split_seed: the seed of the split's permutation.

    Attributes:
        tokens: uint8 (num, image_size²); labels: long (num,); ``num_classes`` (10),
        ``max_len`` (image_size²).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        image_size: int = 32,
        val_size: int = 250,
        test_size: int = 250,
        split_seed: int = 0,
    ) -> None:
        self.split = check_choice("split", split, SPLITS)
        check_int("image_size", image_size, ge=1)
        check_int("val_size", val_size, ge=1)
        check_int("test_size", test_size, ge=1)
        check_int("split_seed", split_seed, ge=0)
        if val_size + test_size >= DIGITS_COUNT:
            raise ValueError(
                f"val_size + test_size must leave training images out of {DIGITS_COUNT}, got "
                f"{val_size} + {test_size}"
            )
        images, labels = load_digit_images()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(split_seed))
        num_train = len(labels) - val_size - test_size
        parts = {
            "train": order[:num_train],
            "val": order[num_train : num_train + val_size],
            "test": order[num_train + val_size :],
        }
        index = parts[split].sort().values
        self.tokens = upsample_gray(images[index], image_size).reshape(len(index), -1)
        self.labels = labels[index]
        self.num_classes = 10
        self.max_len = image_size * image_size
        self.vocab_size = PIXEL_VOCAB_SIZE

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.tokens[index].long(), int(self.labels[index])
