"""Everything that knows EasyEdit; ``hpse_easyedit.easyedit`` is the public entry point.

- ``easyedit_import``: find EasyEdit's source checkout, refuse stale versions, import it.
- ``entries``: EasyEdit's editor contract ``apply_X_to_model(...) -> (model, weights_copy)`` over
  the engine's edits (``apply_hpse_to_model``, ``apply_coin_to_model``,
  ``apply_unke_family_to_model``), and ``EditHandle``.
- ``registration``: the registry's methods (``hpse_easyedit.methods``) as ``ALG_DICT`` methods of
  ``BaseEditor``, and ``make_editor`` (a ``BaseEditor`` on the model ``factory`` loads).
- ``patches``: the changes to EasyEdit's classes it has no hook for (the batchable check,
  ``BaseEditor.from_hparams``, request checks before ``edit``), each saying why.
- ``factory``: ``load_checked_model`` (the model ``hpse_easyedit.load_model`` loads, its layers
  checked against the hparams) and ``is_project_hparams``.
- ``unstructured``: HPSE and COIN* as methods of EasyEdit's ``run_AKEW_both.py``.
- ``covariance``: MEMIT's and AlphaEdit's second-moment statistics from local text, in EasyEdit's
  cache format.
- ``baselines``: adapters over EasyEdit's own MEMIT, AlphaEdit, UnKE and AnyEdit, and their hparams
  classes.

Imports run one way: the engine (``editor``, ``coin``, ``executors``, ``loading``) and the registry
table (``methods``) below, these modules above them, and ``builtin_methods`` (which registers the
methods with their entries) above these. Nothing is imported here; EasyEdit itself is imported only
when a method that runs its code is used.
"""
