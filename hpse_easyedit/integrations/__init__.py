"""EasyEdit integration pieces; ``hpse_easyedit.easyedit`` is the public entry point.

- ``easyedit_import``: find EasyEdit's source checkout, refuse stale versions, import it.
- ``registration``: HPSE, COIN*, UnKE and AnyEdit as ``ALG_DICT`` methods of ``BaseEditor``, and
  ``BaseEditor.from_hparams`` of our hparams routed through ``methods.make_editor``.
- ``baselines``: adapters over EasyEdit's own MEMIT, AlphaEdit, UnKE and AnyEdit.
- ``methods``: one hparams loader, ``BaseEditor`` factory and benchmark-runner spec for every method.
- ``config``: the validated-dataclass base of our hparams classes.

Only ``config`` is imported here; the rest import EasyEdit when used.
"""
