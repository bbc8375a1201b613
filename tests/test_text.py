"""Text normalisation: what is kept, what is removed (and counted), what is reported by name."""

from finetune.data.text import TextNormalizer, describe_oov

KURMANJI = set("abcçdeêfghiîjklmnopqrsştuûvwxyz '")


def test_lowercases_and_removes_punctuation_like_the_tokenizer():
    check = TextNormalizer(KURMANJI)("Rojbaş, tu çawa yî?")
    assert check.text == "rojbaş tu çawa yî"
    assert check.oov == ()
    assert check.removed == (",", "?")


def test_digits_and_foreign_letters_are_reported_not_deleted():
    check = TextNormalizer(KURMANJI)("Sala 2024 ñ")
    assert check.oov == ("2", "0", "4", "ñ")
    message = describe_oov(check.oov)
    assert "'2'" in message and "write numbers out as words" in message and "'ñ' (U+00F1)" in message


def test_typographic_apostrophe_maps_to_the_vocabulary_form():
    assert TextNormalizer(KURMANJI)("Kurdî’ye").text == "kurdî'ye"


def test_letters_in_the_vocabulary_are_kept_even_if_unusual():
    check = TextNormalizer(KURMANJI | {"ñ"})("Año")
    assert check.text == "año" and check.oov == ()


def test_open_vocabulary_keeps_every_letter_in_lower_case_but_reports_digits():
    check = TextNormalizer(None)("Îro ÇAWA 3")
    assert check.text == "îro çawa"
    assert check.oov == ("3",)


def test_whitespace_collapses_and_text_of_only_punctuation_is_empty():
    normalizer = TextNormalizer(KURMANJI)
    assert normalizer("  ez \t  tu \n").text == "ez tu"
    assert normalizer("?!...").text == ""
