"""TextStream: streamed pieces concatenate to the whole text; stop strings split across tokens cut the
text before the first one completed; an incomplete UTF-8 tail is held back until the next token completes it."""
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.serve.text import TextStream


class Bytes:
    """Each token id is one byte; decode is UTF-8 with replacement (as byte-level BPE decoders do)."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def _feed(stream: TextStream, ids: list, steps: list) -> list:
    pieces, at = [], 0
    for n in steps:
        pieces.append(stream.add(ids[at:at + n]))
        at += n
        if stream.stopped:
            break
    return pieces + [stream.flush()]


def test_stop_string_split_across_tokens_is_cut_and_never_streamed():
    ids = list("abc STOP tail".encode())
    stream = TextStream(Bytes(), stop=("STOP",))
    pieces = _feed(stream, ids, [1] * len(ids))
    assert "".join(pieces) == "abc " and stream.stopped
    assert not any("S" in p for p in pieces)


def test_incomplete_utf8_is_held_back_until_complete():
    ids = list("x€y".encode())                 # € is 3 bytes
    stream = TextStream(Bytes())
    assert stream.add(ids[:2]) == "x"          # x + the first byte of €: only x is safe
    assert stream.add(ids[2:3]) == ""
    assert stream.add(ids[3:4]) == "€"
    assert stream.add(ids[4:]) + stream.flush() == "y"


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab€\n"), max_size=24), stop=st.lists(st.text(alphabet=st.sampled_from("ab€\n"), min_size=1, max_size=3),
                                                                  max_size=2),
       steps=st.lists(st.integers(1, 4), min_size=40, max_size=40))
def test_pieces_concatenate_to_the_text_before_the_first_completed_stop(text, stop, steps):
    ids = list(text.encode())
    stream = TextStream(Bytes(), stop=tuple(stop))
    got = "".join(_feed(stream, ids, steps))
    want, stopped = text, False
    for n in range(1, len(text) + 1):          # the first stop string completed, reading char by char
        ended = [s for s in stop if text[:n].endswith(s)]
        if ended:
            want, stopped = text[:n - max(map(len, ended))], True
            break
    assert got == want
    assert stream.stopped == stopped
