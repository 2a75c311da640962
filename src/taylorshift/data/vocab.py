"""Token vocabularies of the paper's sequence tasks (the sizes the presets' embeddings need).

Token ids are positions in these tuples. The models learn their CLS token as a vector, so
the ``<cls>`` entries are only for data pipelines that prefer a CLS id in the sequence;
padding is given to the models as a mask, so the id under a ``<pad>`` never matters.
"""

from __future__ import annotations

PAD, CLS = "<pad>", "<cls>"

#: ListOps operators: MIN, MAX, MED (median), SM (sum mod 10), FIRST, LAST.
LISTOPS_OPERATORS = ("MIN", "MAX", "MED", "SM", "FIRST", "LAST")

#: ListOps tokens: pad, cls, digits 0-9, the operators, "[" and "]" (20 ids).
LISTOPS_TOKENS = (PAD, CLS, *"0123456789", *LISTOPS_OPERATORS, "[", "]")
LISTOPS_VOCAB_SIZE = len(LISTOPS_TOKENS)

#: CIFAR-10 pixel task: one token per 8-bit gray level.
PIXEL_VOCAB_SIZE = 256

#: Byte-level text (IMDB): id = byte value 0-255, then pad (256) and cls (257).
BYTE_PAD_ID, BYTE_CLS_ID = 256, 257
BYTE_VOCAB_SIZE = 258
