"""The task vocabularies, kept here for old imports: they live in :mod:`taylorshift.data.vocab`
(data is below models in the package layers; models read the sizes from there)."""

from ..data.vocab import (  # noqa: F401
    BYTE_CLS_ID,
    BYTE_PAD_ID,
    BYTE_VOCAB_SIZE,
    CLS,
    LISTOPS_OPERATORS,
    LISTOPS_TOKENS,
    LISTOPS_VOCAB_SIZE,
    PAD,
    PIXEL_VOCAB_SIZE,
)
