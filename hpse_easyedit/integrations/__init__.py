"""EasyEdit integration pieces; ``hpse_easyedit.easyedit`` is the public entry point.

- ``easyedit_import``: find EasyEdit's source checkout, refuse stale versions, import it.
- ``entries``: the functions EasyEdit's ``BaseEditor`` calls for the registry's methods, and ``EditHandle``.
- ``registration``: the registry's methods (``hpse_easyedit.methods``: HPSE, COIN*, UnKE, AnyEdit) as
  ``ALG_DICT`` methods of ``BaseEditor``, ``make_editor`` (a ``BaseEditor`` on the model ``factory`` loads),
  and ``BaseEditor.from_hparams`` of our hparams routed through it.
- ``factory``: ``load_checked_model`` (the model ``hpse_easyedit.load_model`` loads, its layers checked
  against the hparams) and ``is_project_hparams``.
- ``baselines``: adapters over EasyEdit's own MEMIT, AlphaEdit, UnKE and AnyEdit, and their hparams classes.

Imports run one way: registration -> methods -> entries, factory, baselines. Nothing is imported here; EasyEdit itself is imported only when a method that runs its code is used.
"""
