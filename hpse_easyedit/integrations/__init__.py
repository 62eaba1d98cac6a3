"""EasyEdit integration pieces; ``hpse_easyedit.easyedit`` is the public entry point.

- ``easyedit_import``: find EasyEdit's source checkout, refuse stale versions, import it.
- ``registration``: the registry's methods (``hpse_easyedit.methods``: HPSE, COIN*, UnKE, AnyEdit) as
  ``ALG_DICT`` methods of ``BaseEditor``, and ``BaseEditor.from_hparams`` of our hparams routed through
  ``factory.make_editor``.
- ``factory``: ``make_editor`` (a ``BaseEditor`` on a model ``hpse_easyedit.load_model`` loaded) and
  ``load_checked_model``.
- ``baselines``: adapters over EasyEdit's own MEMIT, AlphaEdit, UnKE and AnyEdit, and their hparams classes.

Nothing is imported here; EasyEdit itself is imported only when a method that runs its code is used.
"""
