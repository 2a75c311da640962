"""Interoperability with other libraries; each submodule imports its library only when used.

- ``taylorshift.integrations.timm``: our attention inside timm's VisionTransformer
  (``pip install 'taylorshift[timm]'``).
"""
