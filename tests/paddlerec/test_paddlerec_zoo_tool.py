"""tools/paddlerec_zoo.py derives recall/fasttext's ``word_ngrams_id.txt`` (made by
the model's data_prepare.sh from the corpus it downloads) from the dictionaries the
repository holds: each word's id, then the ids of its character n-grams, an id being
the line of an entry's last occurrence in ``word_count_dict.txt``. Checked on a
dictionary written by hand, and refused when the dictionaries do not agree."""

import importlib
import sys

import pytest
from support import REPO

sys.path.insert(0, str(REPO / "tools"))
zoo = importlib.import_module("paddlerec_zoo")

# Two words, then their n-grams of 3 to 5 characters, by falling count, as
# fastText's preprocess writes them. '<ab>' is also an n-gram of itself (line 3)
# and '<abc>' of itself (line 6): the last line is the id.
COUNTS = """<ab> 9
<abc> 7
<ab 2
<ab> 1
ab> 1
<abc 1
<abc> 1
abc 1
abc> 1
bc> 1
"""
IDS = {"<ab>": 3, "<abc>": 6, "<ab": 2, "ab>": 4, "<abc": 5, "abc": 7, "abc>": 8, "bc>": 9}


def _dicts(tmp_path, ids=IDS, counts=COUNTS):
    (tmp_path / "word_count_dict.txt").write_text(counts, encoding="utf-8")
    (tmp_path / "word_id_dict.txt").write_text(
        "".join(f"{k} {v}\n" for k, v in ids.items()), encoding="utf-8")
    return tmp_path


def test_word_ngram_ids_from_the_dictionaries(tmp_path):
    assert zoo.fasttext_ngram_ids(_dicts(tmp_path), 3, 5) == 2
    lines = (tmp_path / "word_ngrams_id.txt").read_text().splitlines()
    # <ab>: <ab, <ab>, ab>;  <abc>: <ab, <abc, <abc>, abc, abc>, bc>
    assert lines == ["3 2 3 4", "6 2 5 6 7 8 9"]


def test_dictionaries_of_two_runs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not of one preprocess run"):
        zoo.fasttext_ngram_ids(_dicts(tmp_path, ids={**IDS, "<ab>": 0}), 3, 5)
    missing = COUNTS.removesuffix("bc> 1\n")                  # its last line
    ids = {k: v for k, v in IDS.items() if k != "bc>"}
    with pytest.raises(ValueError, match=r"lacks the n-grams \['bc>'\] of '<abc>'"):
        zoo.fasttext_ngram_ids(_dicts(tmp_path, ids=ids, counts=missing), 3, 5)


def test_a_one_line_data_file_goes_whole_to_both_workers(tmp_path):
    (tmp_path / "sample.txt").write_text("1 2 3\n")
    zoo._split_in_two(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-0", "part-1"]
    assert (tmp_path / "part-0").read_text() == (tmp_path / "part-1").read_text() == "1 2 3\n"
