"""Callbacks that run a training stack's own loop under Teto with a three-line change: ``transformers`` (the
``Trainer`` family, with or without ``peft``) and Lightning. Their decisions are pure functions in ``policy.py``;
each stack's module is the thin edge that reads the library's objects and calls ``teto.sdk``. Importing this
package imports neither stack (``pip install 'teto[hf]'`` / ``'teto[lightning]'`` bring them)."""
