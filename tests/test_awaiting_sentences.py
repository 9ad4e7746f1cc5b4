"""Content heuristics of awaiting detection (engine/awaiting.py), read faster, the same.

The reply is split into sentences by a pattern that skips to the characters a sentence
can end at, and a reply without any word that asks to confirm is not searched sentence
by sentence for a request to confirm. Both are shortcuts: every reply here must read as
the plain sentence-by-sentence reading reads it (end to end, through an agent over
HTTP: tests/test_engine_conversations.py)."""

from __future__ import annotations

import re

import pytest

from agenttest_worker.engine import awaiting

# The sentence split as written before its scan skipped ahead (the reference).
PLAIN_SENTENCE_END = re.compile(r"([.!?][\"'”’)\]*_`]*)(?=\s|$)|([。？！])|\n+")

LONG = (
    "I've filed your expense report for the team dinner on March 3rd. The total was "
    "$245.80, split across 6 attendees, within the per-person limit of $50. Your "
    "manager will get a notification to approve it; approvals usually take a day. "
)
REPLIES = [
    "",
    "Saved.",
    "Noted, thank you. " + "lorem ipsum dolor sit amet " * 40,
    LONG * 4,
    LONG + "Please CONFIRM the amount.",
    LONG + "If you want me to proceed, reply YES.",
    "I will reply to the vendor and continue.",
    "Kindly verify your details",
    "Shall we go on",
    "**Is $3500 the right amount?** I can change it.",
    "Could you send the receipt. It helps.",
    "Done!\n\nNext steps:\n- none",
    "完成了。需要确认吗？",
    "Réservé pour demain. Voulez-vous continuer ?",
    # Letters that IGNORECASE matches to "i" outside ASCII: the shortcut must not hide them.
    "Kindly confİrm.",
    "Kindly confırm.",
    "Type YES to PROCEED.",
    'He said "stop." Then left... "Really?" she asked.',
]


def plain_sentences(text: str) -> list[str]:
    pieces, start = [], 0
    for match in PLAIN_SENTENCE_END.finditer(text):
        end = match.end() if match.group(1) or match.group(2) else match.start()
        pieces.append(text[start:end])
        start = match.end()
    pieces.append(text[start:])
    return [s for raw in pieces if (s := raw.strip(awaiting._DECORATION))]


def plain_reading(text: str) -> bool:
    return any(
        s.endswith(("?", "？"))
        or awaiting._QUESTION_START.match(s) is not None
        or awaiting.asks_to_confirm(s)
        for s in plain_sentences(text)
    )


@pytest.mark.parametrize("reply", REPLIES)
def test_a_reply_reads_as_sentence_by_sentence(reply: str) -> None:
    assert awaiting.sentences(reply) == plain_sentences(reply)
    assert awaiting.looks_like_question(reply) == plain_reading(reply)


def test_the_shortcut_still_finds_requests_to_confirm() -> None:
    found = [r for r in REPLIES if awaiting.looks_like_question(r)]
    assert LONG + "Please CONFIRM the amount." in found
    assert "Kindly confİrm." in found and "Kindly confırm." in found
    assert "Type YES to PROCEED." in found
    assert "I will reply to the vendor and continue." not in found
