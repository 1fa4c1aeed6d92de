"""The char-LM's data and run record (retrograd/charlm.py): vocabularies, --text files, the
optimizer and schedule tables; the command itself is tested in test_train_cli.py."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.models import charlm
from retrograd.models.charlm import (BUILTIN_VOCAB, UNKNOWN_SYMBOL, ModelConfig, TrainError, Vocab,
                                     check_seq_len, load_text, make_lr, make_optimizer,
                                     read_record, run_record)


def test_vocab_of_a_text_is_its_characters_plus_the_unknown_symbol():
    vocab = Vocab.of_text("hello wörld 😀")
    assert vocab.chars == " dehlorwö😀" + UNKNOWN_SYMBOL and vocab.unknown == len(vocab) - 1
    ids = vocab.encode("hello!😀")
    np.testing.assert_array_equal(ids, [3, 2, 4, 4, 5, vocab.unknown, 9])
    assert vocab.decode(ids) == "hello" + UNKNOWN_SYMBOL + "😀"
    assert Vocab.of_text("a" + UNKNOWN_SYMBOL).chars == "a" + UNKNOWN_SYMBOL     # not added twice


def test_builtin_vocab_encodes_as_the_fixed_table():
    text = "def f(x):\n\treturn 'é'\n"
    np.testing.assert_array_equal(BUILTIN_VOCAB.encode(text), charlm.encode(text))
    assert len(BUILTIN_VOCAB) == 96 and BUILTIN_VOCAB.chars[BUILTIN_VOCAB.unknown] == "?"


def test_load_text_joins_files_and_globs_in_order(tmp_path):
    (tmp_path / "b.md").write_text("bb", encoding="utf-8")
    (tmp_path / "a.md").write_text("aa", encoding="utf-8")
    (tmp_path / "first.txt").write_bytes("\ufeffOnce upon".encode("utf-8"))     # a BOM is not text
    corpus = load_text([str(tmp_path / "first.txt"), str(tmp_path / "*.md"), str(tmp_path / "a.md")])
    assert [name for name, _ in corpus.sources] == [str(tmp_path / n) for n in ("first.txt", "a.md", "b.md")]
    assert corpus.vocab.decode(corpus.ids) == "Once uponaabb" and corpus.prompt == "Once"
    assert [n for _, n in corpus.sources] == [9, 2, 2]


def test_check_seq_len_needs_a_window_and_its_next_character():
    check_seq_len(8, np.zeros(10), np.zeros(9))
    with pytest.raises(TrainError, match=r"--seq-len 9 is longer than the training text \(10 characters\)"):
        check_seq_len(9, np.zeros(10), np.zeros(20))
    with pytest.raises(TrainError, match=r"--seq-len 9 is longer than the held-out text \(9 characters\); "
                                         r"use --seq-len 8 or less"):
        check_seq_len(9, np.zeros(20), np.zeros(9))


def test_run_record_round_trips_through_the_parameter_file(tmp_path):
    vocab = Vocab.of_text("naïve\n")
    cfg = ModelConfig(hidden=8, embed=4, vocab=vocab)
    t = charlm.build_training(cfg, 4, "sgd", 0.1, None, 0, prompt="naï")
    exe = rg.Executor()
    exe.run(t.startup)
    rg.save_params(exe.scope, tmp_path / "m.npz", t.main)
    params = rg.read_params(tmp_path / "m.npz")
    assert read_record(params, "m.npz") == run_record(cfg, "sgd", "naï")
    assert charlm.config_from_params(params, "m.npz") == ModelConfig(hidden=8, embed=4, vocab=vocab)
    damaged = dict(params, **{charlm.RECORD: np.array([1, 2, 3], np.int32)})
    with pytest.raises(TrainError, match="is damaged"):
        read_record(damaged, "m.npz")


def test_every_optimizer_name_builds_its_rg_optim_class_or_names_what_is_missing():
    for name, (class_name, _) in charlm.OPTIMIZERS.items():
        if hasattr(rg.optim, class_name):
            assert type(make_optimizer(name, 0.1, None, 0.01)).__name__ == class_name
        else:
            with pytest.raises(TrainError, match=rf"--optimizer {name} is not available yet: it needs "
                                                 rf"rg.optim.{class_name}"):
                make_optimizer(name, 0.1, None)
    assert make_optimizer("momentum", 0.1, None).momentum == 0.9


def test_a_constant_rate_without_warmup_is_the_number_itself():
    assert make_lr("constant", 3e-3) == 3e-3
    with pytest.raises(TrainError, match="--warmup works with --lr-schedule constant or cosine"):
        make_lr("step", 3e-3, warmup=10, total_steps=100)


def test_whole_step_budget_is_a_transformers_byte_recompute_at_the_run_windows():
    cfg = ModelConfig("transformer", recompute=400_000)
    assert charlm.whole_step_budget(cfg, 32, 4) == {"memory_budget": 400_000,
                                             "feed_shapes": {"chars": (32, 4), "next_chars": (32, 4)}}
    for other in (ModelConfig("lstm", recompute=400_000), ModelConfig("transformer", recompute="steps"),
                  ModelConfig("transformer")):
        assert charlm.whole_step_budget(other, 32, 4) == {}       # a layer's own budget, or none
    with pytest.raises(TrainError, match="batch size"):
        charlm.whole_step_budget(cfg, 32, None)
