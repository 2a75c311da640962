"""Models: an encoder classifier for token sequences, a Vision Transformer, a registry.

- ``TransformerClassifier`` (``ClassifierConfig``): token ids or continuous features, with
  optional convolutional token embedding, cosine or learned positions, CLS or mean pooling,
  padding masks end to end.
- ``VisionTransformer`` (``ViTConfig``): patch embedding (linear or a CNN stem).
- ``CausalLM`` (``CausalLMConfig``): decoder-only language model with ``generate()``, a
  constant-size TaylorShift (or linear-attention) state or a key/value cache.
- ``create_model(name, **overrides)`` / ``list_models()``: the paper's tasks (Table 6), small
  variants, one name per attention kernel; ``@register_model`` adds more.
- ``save_model`` / ``load_model`` / ``load_weights``: safetensors files with the config.
"""

from ..data.vocab import (
    BYTE_CLS_ID,
    BYTE_PAD_ID,
    BYTE_VOCAB_SIZE,
    LISTOPS_TOKENS,
    LISTOPS_VOCAB_SIZE,
    PIXEL_VOCAB_SIZE,
)
from . import presets as _presets  # noqa: F401  (registers the presets)
from .causal_lm import CausalLM, CausalLMConfig
from .classifier import TOKEN_EMBEDDINGS, ClassifierConfig, TransformerClassifier
from .embedding import (
    ConvTokenEmbedding,
    CosinePositionEmbedding,
    LearnedPositionEmbedding,
    PatchEmbedding,
    sinusoidal_position_embedding,
)
from .encoder import (
    POOLINGS,
    POS_EMBEDDINGS,
    EncoderClassifier,
    EncoderConfig,
    ModelConfigBase,
)
from .registry import (
    create_model,
    get_model_class,
    list_models,
    register_model,
    register_model_class,
)
from .vit import PATCH_EMBEDDINGS, VisionTransformer, ViTConfig
from .weights import load_model, load_weights, read_model_config, save_model

__all__ = [
    "BYTE_CLS_ID",
    "BYTE_PAD_ID",
    "BYTE_VOCAB_SIZE",
    "LISTOPS_TOKENS",
    "LISTOPS_VOCAB_SIZE",
    "PATCH_EMBEDDINGS",
    "PIXEL_VOCAB_SIZE",
    "POOLINGS",
    "POS_EMBEDDINGS",
    "TOKEN_EMBEDDINGS",
    "CausalLM",
    "CausalLMConfig",
    "ClassifierConfig",
    "ConvTokenEmbedding",
    "CosinePositionEmbedding",
    "EncoderClassifier",
    "EncoderConfig",
    "LearnedPositionEmbedding",
    "ModelConfigBase",
    "PatchEmbedding",
    "TransformerClassifier",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "get_model_class",
    "list_models",
    "load_model",
    "load_weights",
    "read_model_config",
    "register_model",
    "register_model_class",
    "save_model",
    "sinusoidal_position_embedding",
]
