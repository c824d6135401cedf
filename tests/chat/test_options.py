"""A session's options (agent/chat/options.py): parsed once, stored as typed JSON, and old
databases' text values still read."""

from __future__ import annotations

import pytest

from agent.chat.options import SessionOptions, parse_pairs


def test_text_pairs_parse_to_typed_values():
    given = parse_pairs([("temperature", "0"), ("top-k", "5"), ("stop", "###"), ("stop", "END"), ("seed", "none"),
                         ("refresh", "off"), ("refresh_tokens", "64")])
    assert given == {"temperature": 0.0, "top_k": 5, "stop": ["###", "END"], "seed": None, "refresh": False,
                     "refresh_tokens": 64}
    opts = SessionOptions().with_values(given)
    assert opts.sampling.temperature == 0 and opts.sampling.stop == ("###", "END") and opts.refresh.on is False


@pytest.mark.parametrize("pair, match", [
    (("temp", "1"), "unknown sampling option"),
    (("top_p", "high"), "needs a number"),
    (("top_p", "2"), "top_p"),
    (("top_k", "5.5"), "needs a number"),
    (("refresh", "maybe"), "on or off"),
    (("refresh_tokens", "4"), "refresh_tokens must be >= 16"),
])
def test_bad_text_is_refused_by_name(pair, match):
    with pytest.raises(ValueError, match=match):
        parse_pairs([pair])


def test_stored_is_the_typed_difference_from_the_defaults():
    opts = SessionOptions().with_text([("temperature", "0.2"), ("refresh", "off"), ("stop", "###"), ("top_k", "0")])
    assert opts.stored() == {"temperature": 0.2, "refresh": False, "stop": ["###"]}
    assert SessionOptions().with_values(opts.stored()) == opts  # what is stored reads back the same


def test_set_stop_adds_a_stop_string_and_stored_values_replace():
    opts = SessionOptions().with_text([("stop", "A")]).with_text([("stop", "B")])
    assert opts.sampling.stop == ("A", "B")
    assert opts.with_values({"stop": ["C"]}).sampling.stop == ("C",)


def test_an_older_database_s_text_values_still_read():
    """Options stored as strings (before they were stored typed) read as if typed at -o."""
    old = {"temperature": "0.2", "top_k": "5", "seed": "None", "refresh": "False", "refresh_horizon": "300"}
    opts = SessionOptions().with_values(old)
    assert opts.stored() == {"temperature": 0.2, "top_k": 5, "refresh": False, "refresh_horizon": 300}
