"""Corpora and token streams: a deterministic held-out split of the Python documentation, batches
that are a pure function of (seed, position), and one-line errors for bad corpus paths (issue 15)."""

from __future__ import annotations

import numpy as np
import pytest

from maxjax.train.data import ByteTokenizer, TokenStream, load_corpus, python_docs_path


@pytest.fixture(scope="module")
def docs():
    try:
        return python_docs_path()
    except FileNotFoundError as e:  # scripts/setup.sh installs python3-doc where it can (root + apt-get)
        pytest.skip(str(e))


def test_the_python_docs_split_is_deterministic_and_disjoint(docs):
    a = load_corpus(docs)
    b = load_corpus(docs)
    assert a.train == b.train and a.held_out == b.held_out
    assert not set(a.train) & set(a.held_out)
    assert 0.02 < len(a.held_out) / (len(a.train) + len(a.held_out)) < 0.1
    assert any(p.name == "itertools.rst.txt" for p in a.train + a.held_out)
    text = next(a.texts("held_out"))
    assert len(text) > 100
    small = load_corpus(docs, max_files=20)
    assert len(small.train) + len(small.held_out) == 20 and small.held_out


def test_batches_are_a_pure_function_of_seed_and_position():
    stream = TokenStream.from_texts(["abcdefghij" * 30, "klmnopqrst" * 30], ByteTokenizer().encode_batch, ByteTokenizer.separator)
    assert len(stream) == 602 and stream.tokens[300] == 256
    first = [b for _, b in zip(range(7), stream.batches(3, 20, seed=1))]
    again = [b for _, b in zip(range(4), stream.batches(3, 20, seed=1, start=3))]
    for x, y in zip(first[3:], again):
        np.testing.assert_array_equal(x[1], y[1])
    assert first[0][1].shape == (3, 21) and first[0][1].dtype == np.int32
    # each window's last token is the next window's first: every token is a target once an epoch
    w0, w1 = stream.window(0, 20), stream.window(1, 20)
    assert w0[-1] == w1[0]
    counting = TokenStream(np.arange(601))  # 30 windows of 21 tokens, 20 apart
    epoch = np.concatenate([b for _, (_, b) in zip(range(10), counting.batches(3, 20, seed=1))])
    assert sorted(epoch[:, 0]) == list(range(0, 600, 20))  # one epoch visits every window once
    nxt = counting.batch(10, 3, 20, seed=1)  # the next epoch is shuffled anew
    assert not np.array_equal(nxt, epoch[:3])
    ev = stream.eval_batches(3, 20, max_batches=2)
    assert len(ev) == 2 and np.array_equal(ev[0][0], w0)
    assert ByteTokenizer().decode(ByteTokenizer().encode("héllo")) == "héllo"


def test_bad_corpus_paths_are_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^corpus '.*/nowhere': no such file or directory$"):
        load_corpus(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("  \n")
    with pytest.raises(ValueError, match=r"^corpus '.*/empty' is empty: no non-empty \.txt/\.rst/\.md files$"):
        load_corpus(tmp_path / "empty")
    with pytest.raises(ValueError, match="fewer than a batch of 8"):
        TokenStream(np.arange(50)).batch(0, 8, 16)
