"""hpse_easyedit.text.sentence_spans: the one sentence splitter (COIN's chunks, the benchmarks'
sentences)."""

from benchmarks.tasks.metrics import first_sentence, split_sentences
from hpse_easyedit.text import sentence_spans


def test_sentence_spans_are_stripped_character_spans():
    text = (
        "  Dr. Li met J. Smith in the U.S. in 1999. He left!\r\n\n  "
        '"Why?" she asked. (Nobody knew.)\u2028last line '
    )
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == [
        "Dr. Li met J. Smith in the U.S. in 1999.",
        "He left!",
        '"Why?" she asked.',
        "(Nobody knew.)",
        "last line",
    ]
    assert [text[a:b] for a, b in spans] == split_sentences(text)
    assert first_sentence(text) == "Dr. Li met J. Smith in the U.S. in 1999."


def test_no_split_before_lower_case_or_list_markup_and_nothing_for_blank_text():
    assert split_sentences("It rained. then it stopped. 1. **Bold** item.") == [
        "It rained. then it stopped.",
        "1. **Bold** item.",
    ]
    assert sentence_spans("") == sentence_spans(" \n\t\n") == [] and first_sentence("\n") == ""


def test_nltk_untrained_punkt_splits_where_the_regex_keeps_one_sentence():
    """Why ``sentence_spans`` is not nltk's: the untrained Punkt cuts after initials and list
    numbers."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    text = "A book by J.J. Liu, a philosopher. 1. **Bold** item."
    assert split_sentences(text) == ["A book by J.J. Liu, a philosopher.", "1. **Bold** item."]
    assert PunktSentenceTokenizer().tokenize(text) != split_sentences(text)
