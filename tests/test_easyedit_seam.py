"""The EasyEdit front door as a newcomer meets it: request mistakes in the project's one-line words
before EasyEdit's asserts, sequential edits undone in the wrong order said in one line, a
weights_copy that prints short. Needs EasyEdit (``$EASYEDIT_SRC``; skipped with the reason
otherwise)."""

import pytest
import torch

from hpse_easyedit.edit_requests import RequestError

TINY = (
    "alg_name: HPSE\nmodel_name: {model}\nrounds: 1\ninner_steps: 2\nmax_new_tokens: 4\nlr: 0.05\n"
)


@pytest.fixture(scope="module")
def editor(he, tiny_model, tmp_path_factory):
    from easyeditor import BaseEditor

    from hpse_easyedit import HPSEHyperParams

    root = tmp_path_factory.mktemp("seam")
    (root / "hpse.yaml").write_text(TINY.format(model=tiny_model))
    return BaseEditor.from_hparams(HPSEHyperParams.from_hparams(root / "hpse.yaml"))


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (
            dict(prompts=["Introduce A.", "Introduce B."], target_new=["A is a painter."]),
            "target_new has 1 entries but prompts has 2",
        ),
        (
            dict(prompts=["Introduce A."], target_new=["A is a painter."], subject=["A", "B"]),
            "subject has 2 entries but prompts has 1",
        ),
        (
            dict(prompts=["Introduce A."], target_new=[""]),
            "request 0: 'target_new' must be the non-empty passage",
        ),
        (dict(prompts=["Introduce A."], target_new=["🙂🙂"]), "has no letter or digit"),
    ],
)
def test_request_mistakes_are_the_projects_one_line_errors(editor, workdir, kwargs, fragment):
    for method in (editor.edit, editor.batch_edit):
        with pytest.raises(RequestError, match=fragment):
            method(**kwargs)


def test_sequential_edits_undone_in_the_wrong_order_say_so_and_the_right_order_restores(
    editor, workdir
):
    tok = editor.tok
    ids = torch.tensor([tok.encode("Introduce AJ Lee.")])
    with torch.no_grad():
        before = editor.model(input_ids=ids).logits
    handles = []
    for passage in ("AJ Lee speaks Russian fluently.", "AJ Lee was born in Oslo."):
        _, _, undo = editor.edit(
            prompts=["Introduce AJ Lee."],
            target_new=[passage],
            subject=["AJ Lee"],
            sequential_edit=True,
        )
        handles.append(undo)
    assert repr(handles[0]).startswith("<EditHandle: ") and len(repr(handles[0]).splitlines()) == 1
    with pytest.raises(
        Exception,
        match="undo sequential edits last first: this weights_copy undoes edit 1 of the 2",
    ):
        handles[0]()
    model = handles[1]()
    model = handles[0]()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)
