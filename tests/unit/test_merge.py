"""Merging a restatement into a stored fact: new details once, the same thing never twice."""

from __future__ import annotations

import pytest

from processors.merge import MAX_MERGED_CHARS, folded_words, merge_details

FOUNDER = "The user is the founder and CEO of Helix Labs, a climate data startup."


@pytest.mark.parametrize(
    ("old", "new", "merged"),
    [
        # Another wording of the same thing adds nothing: the fact stays as it is.
        (
            FOUNDER,
            "The user is the founder and chief executive of Helix Labs, a climate data company.",
            FOUNDER,
        ),
        (
            "The user lives in Utrecht.",
            "The user is based in Utrecht.",
            "The user lives in Utrecht.",
        ),
        (
            "Melanie's kids love the beach.",
            "Melanie's children love the beach!",
            "Melanie's kids love the beach.",
        ),
        # A richer wording of the whole fact replaces it.
        (
            "The user lives in Utrecht.",
            "The user lives in Utrecht now and commutes to Amsterdam.",
            "The user lives in Utrecht now and commutes to Amsterdam.",
        ),
        # Otherwise only the sentences with new details follow, the speaker named once.
        (
            "Caroline went to a LGBTQ support group on 7 May 2023.",
            "Caroline: The support group was powerful. Caroline met a trans woman named Ana there.",
            (
                "Caroline went to a LGBTQ support group on 7 May 2023. Caroline met a trans woman "
                "named Ana there."
            ),
        ),
        (
            "Jon lost Jon's job as a banker",
            "Jon: Starting a dance studio in the city next month.",
            "Jon lost Jon's job as a banker. Starting a dance studio in the city next month.",
        ),
        (
            FOUNDER,
            "The user is the CEO of Helix Labs. Helix Labs closed a seed round of 2 million euros.",
            FOUNDER + " Helix Labs closed a seed round of 2 million euros.",
        ),
    ],
)
def test_merge_adds_new_details_once(old: str, new: str, merged: str) -> None:
    assert merge_details(old, new) == merged


def test_details_that_do_not_fit_are_not_merged() -> None:
    old = ("Caroline " + "paints landscapes " * 20)[: MAX_MERGED_CHARS - 20].strip()
    assert merge_details(old, "Caroline adopted a dog named Oscar from the shelter.") is None


def test_synonyms_fold_to_one_word() -> None:
    assert folded_words("chief executive officer of a startup") == folded_words("CEO of a company")
