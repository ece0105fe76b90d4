"""store.passages.numbered_item: the entry of a numbered list a question asks for by position."""

from store.passages import numbered_item

LIST = "Here you go:\n1. Voice (e.g., male)\n2. Tone\n...\n27. Sound effects (e.g., ambient)\n28. Pace"


def test_the_entry_at_the_asked_position():
    assert numbered_item(LIST, "what was the 27th parameter on that list?") == "27. Sound effects (e.g., ambient)"
    assert numbered_item(LIST, "remind me of item 2") == "2. Tone"
    assert numbered_item(LIST, "and #28?") == "28. Pace"
    assert numbered_item("Steps: 1) unpack 2) plug in 3) switch on", "what was the 3rd step?") == "3) switch on"


def test_no_position_or_no_such_entry():
    assert numbered_item(LIST, "what was the tone parameter?") == ""
    assert numbered_item(LIST, "what was the 40th parameter?") == ""
    # A year or a version is no list entry.
    assert numbered_item("We moved in 2027. It rained.", "the 27th entry") == ""
    assert numbered_item("pinned v1.27) today", "the 27th entry") == ""
