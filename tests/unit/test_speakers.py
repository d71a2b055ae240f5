"""Who a statement is about and how it reads rewritten: real transcript lines, table-driven.

Most rows are LoCoMo turns (the ones BENCHMARKS.md lists as broken before included): the
speaker, not "the user", is the subject, verbs agree, and what is not a verb stays as it is.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from processors.heuristics import to_third_person
from processors.speakers import split_speaker
from processors.statements import extract, informative

SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


@pytest.mark.parametrize(
    ("line", "rewritten"),
    [
        # Broken before: both speakers became "the user", "totallies", "the user-time".
        (
            "Caroline: I went to a LGBTQ support group yesterday",
            "Caroline went to a LGBTQ support group yesterday",
        ),
        ("Melanie: I ran a charity race", "Melanie ran a charity race"),
        ("Melanie: I totally agree", "Melanie totally agrees"),
        (
            "Melanie: I'm carving out some me-time each day",
            "Melanie is carving out some me-time each day",
        ),
        ("Jon: Thanks, Gina! I won't quit", "Thanks, Gina! Jon won't quit"),
        # Verbs agree with the new subject; past, modal and -ed forms stay.
        ("Gina: I apply for grants every month", "Gina applies for grants every month"),
        ("Melanie: I try to go hiking on weekends", "Melanie tries to go hiking on weekends"),
        ("Maria: I kinda like baking on Sundays", "Maria kinda likes baking on Sundays"),
        (
            "Caroline: I've been blessed with loads of love",
            "Caroline has been blessed with loads of love",
        ),
        (
            "John: I'm considering going into policymaking because of my degree",
            "John is considering going into policymaking because of John's degree",
        ),
        (
            "Caroline: I chose them 'cause they help LGBTQ+ folks",
            "Caroline chose them 'cause they help LGBTQ+ folks",
        ),
        (
            "Melanie: My kids are so excited about summer break!",
            "Melanie's kids are so excited about summer break!",
        ),
        ("John: My wife and I went hiking", "John's wife and John went hiking"),
        (
            "Caroline: The support group has made me feel accepted",
            "The support group has made Caroline feel accepted",
        ),
        ("Maria: I do yoga and I go swimming", "Maria does yoga and Maria goes swimming"),
        ("Jon: I don't dance salsa", "Jon doesn't dance salsa"),
        ("Gina: I haven't opened the store yet", "Gina hasn't opened the store yet"),
        ("Jon: I'll keep ya posted", "Jon will keep ya posted"),
        ("Gina: I'd love to see it", "Gina would love to see it"),
        ("Maria: I taught myself to paint", "Maria taught themselves to paint"),
        # A second verb after "and" shares the subject and agrees too; a plural subject's does not.
        (
            "Correction: I live in Utrecht now and commute to Amsterdam.",
            "The user lives in Utrecht now and commutes to Amsterdam.",
        ),
        ("I am a nurse and work at night", "The user is a nurse and works at night"),
        (
            "Gina: I work at the store and really love the team",
            "Gina works at the store and really loves the team",
        ),
        ("I like tea and cake in the morning", "The user likes tea and cake in the morning"),
        ("I enjoy music and dance", "The user enjoys music and dance"),
        ("Mel and I go running on Sundays", "Mel and the user go running on Sundays"),
        (
            "John: My wife and I go hiking and play in the park",
            "John's wife and John go hiking and play in the park",
        ),
        # Broken in the demo before: "and prefer Postgres", "likes the user's morning".
        (
            "I write services in Go and prefer Postgres over anything NoSQL.",
            "The user writes services in Go and prefers Postgres over anything NoSQL.",
        ),
        (
            "I like my morning free of meetings until 10:30.",
            "The user likes their morning free of meetings until 10:30.",
        ),
        ("I went home and cooked my dinner", "The user went home and cooked their dinner"),
        (
            "My name is Maya. I love my dog.",
            "The user's name is Maya. The user loves their dog.",
        ),
        ("I visit Lisbon and love Porto", "The user visits Lisbon and loves Porto"),
        # A name stays a name: "their" could be anyone's.
        ("Caroline: I love my dog", "Caroline loves Caroline's dog"),
        # A line without "I" still names its speaker.
        ("John: We made pizza!", "John: We made pizza!"),
        (
            "Jon: Still working on opening a dance studio.",
            "Jon: Still working on opening a dance studio.",
        ),
        # The user's own chat observations, as before.
        ("I moved to the design team last month", "The user moved to the design team last month"),
        ("Actually I moved to design", "The user moved to design"),
        ("I don't eat meat", "The user doesn't eat meat"),
        (
            "My name is Maya Okafor, but everyone calls me Maya.",
            "The user's name is Maya Okafor, but everyone calls the user Maya.",
        ),
        ("Prefers tea, i.e. no coffee", "Prefers tea, i.e. no coffee"),
        # A label before a colon is not a speaker.
        ("Note: I moved to Porto", "Note: the user moved to Porto"),
        # Someone else's statement stays about them.
        ("Omar's team lead is Marta", "Omar's team lead is Marta"),
        ("Lena's co-founder moved to Porto", "Lena's co-founder moved to Porto"),
        # Adverbs of more than one word, "not", and "cannot" are not the verb.
        ("I no longer live in Berlin", "The user no longer lives in Berlin"),
        ("Jon: I no longer dance", "Jon no longer dances"),
        ("I cannot swim", "The user cannot swim"),
        ("I kind of like jazz", "The user kind of likes jazz"),
        ("Gina: I sort of run a store", "Gina sort of runs a store"),
        ("I not only cook", "The user not only cooks"),
        ("I never eat meat", "The user never eats meat"),
        ("I really no longer drink coffee", "The user really no longer drinks coffee"),
        (
            "I live in Utrecht and no longer work in Amsterdam",
            "The user lives in Utrecht and no longer works in Amsterdam",
        ),
        # "No" opens a correction only as an interjection; "No longer" is what changed.
        ("No longer vegetarian.", "No longer vegetarian."),
        ("No more coffee for me after 2pm", "No more coffee for the user after 2pm"),
        ("No, I live in Berlin.", "The user lives in Berlin."),
        ("Nope. I quit.", "The user quit."),
        ("No - I moved to Porto", "The user moved to Porto"),
        ("No-one told me", "No-one told the user"),
    ],
)
def test_rewrite_names_the_speaker_without_damage(line: str, rewritten: str) -> None:
    assert to_third_person(line) == rewritten


@pytest.mark.parametrize(
    ("line", "statement", "subject"),
    [
        (
            "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
            "Caroline went to a LGBTQ support group on 7 May 2023 and it was powerful.",
            "Caroline",
        ),
        (
            "Melanie: Yeah, I painted that lake sunrise last year! It's special to me.",
            "Melanie painted that lake sunrise in 2022!",
            "Melanie",
        ),
        (
            "Jon: Thanks, Gina! I won't quit - your words motivate me",
            "Jon won't quit - your words motivate Jon",
            "Jon",
        ),
        (
            (
                "Gina: Hey Jon! Long time no talk! A lot's happened - I just got accepted for a "
                "fashion internship!"
            ),
            "Gina just got accepted for a fashion internship!",
            "Gina",
        ),
        (
            "Melanie: I'm off to go swimming with the kids. Talk to you soon!",
            "Melanie is off to go swimming with the kids.",
            "Melanie",
        ),
        (
            (
                "Caroline: I was so happy and thankful. [shares a photo: a photo of a dog walking "
                "past a wall]"
            ),
            (
                "Caroline was happy and thankful. Caroline shared a photo of a dog walking past a "
                "wall."
            ),
            "Caroline",
        ),
        (
            "Caroline: Researching adoption agencies",
            "Caroline: Researching adoption agencies",
            "Caroline",
        ),
        ("I kinda like baking on Sundays", "The user likes baking on Sundays", None),
        # "No" is an opener only when punctuation follows it.
        ("No more coffee for me after 2pm", "No more coffee for the user after 2pm", None),
        ("No, I live in Berlin.", "The user lives in Berlin.", None),
        ("Nope! I moved to Porto", "The user moved to Porto", None),
    ],
)
def test_extracted_statement_is_compact_and_about_its_subject(
    line: str, statement: str, subject: str | None
) -> None:
    extracted = extract(line, SAID)
    assert extracted is not None
    assert (extracted.text, extracted.subject) == (statement, subject)


@pytest.mark.parametrize(
    "line",
    [
        "Caroline: Hey Mel! Good to see you! How have you been?",
        "Melanie: Wow, love that painting! What's it done for you?",
        "Melanie: You'd be a great counselor!",
        "Caroline: Thanks, Melanie! That's really sweet.",
        "Melanie: I totally agree",
        "Jon: Yeah, awesome! Glad to be part of it.",
        "Gina: Congrats, Jon! Good luck!",
    ],
)
def test_content_free_lines_state_nothing(line: str) -> None:
    assert extract(line, SAID) is None
    assert not informative(to_third_person(line))


@pytest.mark.parametrize(
    ("content", "speaker"),
    [
        ("Caroline: hi", "Caroline"),
        ("Mary Ann Smith: hello", "Mary Ann Smith"),
        ("Correction: I moved", None),
        ("PS: call me", None),
        ("I said: go", None),
        ("no speaker here", None),
    ],
)
def test_split_speaker(content: str, speaker: str | None) -> None:
    assert split_speaker(content)[0] == speaker
