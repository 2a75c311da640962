"""Interoperability with other libraries; each submodule imports its library only when used.

- ``taylorshift.integrations.timm``: our attention inside timm's VisionTransformer
  (``pip install 'taylorshift[timm]'``).
- ``taylorshift.integrations.huggingface``: ``register()`` makes
  ``attn_implementation="taylorshift"`` work in ``transformers`` encoders and decoders,
  padding masks and cached generation included (``pip install 'taylorshift[hf]'``).
"""
