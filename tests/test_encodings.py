"""Passage and hparams files: UTF-8 and UTF-8/UTF-16 with a byte-order mark are read; anything else
is one line naming the file and the encoding it looks like."""

import random

import pytest

from hpse_easyedit.cli import main as edit_main
from hpse_easyedit.encoding import TextEncodingError, decode_text
from hpse_easyedit.hparams import HParamsError, read_hparams_file

TEXT = "Selma Varrick est née à Bergen, en Norvège."


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32"])
def test_unicode_files_are_read(encoding):
    assert decode_text(TEXT.encode(encoding), "p.txt") == TEXT


@pytest.mark.parametrize(
    "data,looks",
    [
        (TEXT.encode("latin-1"), "it looks like"),
        (TEXT.encode("utf-16-le"), "it looks like"),  # UTF-16 without its byte-order mark
        # fixed random bytes: the same test id in every process (pytest-xdist compares them)
        (random.Random(0).randbytes(4096), "it does not look like text"),
    ],
    ids=["latin-1", "utf-16-le-no-bom", "random-bytes"],
)
def test_other_bytes_are_refused_naming_the_file(data, looks):
    with pytest.raises(TextEncodingError, match=rf"^p\.txt: not UTF-8 \({looks}.*save it as UTF-8"):
        decode_text(data, "p.txt")


def test_the_edit_command_says_it_in_one_line_before_loading_anything(tmp_path, capsys):
    passage = tmp_path / "passage.txt"
    passage.write_bytes(TEXT.encode("latin-1"))
    hp = tmp_path / "hp.yaml"
    hp.write_text("alg_name: HPSE\nmodel_name: /nonexistent/model\n")
    code = edit_main(
        ["edit", "--hparams", str(hp), "--subject", "Selma", "--passage-file", str(passage)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        code == 2
        and len(err) == 1
        and err[0].startswith(f"error: {passage}: not UTF-8 (it looks like")
    )


def test_an_hparams_file_in_another_encoding_is_one_line(tmp_path):
    hp = tmp_path / "hp.yaml"
    hp.write_bytes("alg_name: HPSE\nmodel_name: modèle\n".encode("utf-16"))
    assert read_hparams_file(hp)["model_name"] == "modèle"
    hp.write_bytes("alg_name: HPSE\nmodel_name: modèle\n".encode("latin-1"))
    with pytest.raises(HParamsError, match="not UTF-8 .*an hparams file is YAML text"):
        read_hparams_file(hp)
