"""`memoryd redrive --stage X` moves X's letters only, and leaves the others redrivable.

A redrive of one stage reads the whole dead-letter topic. When every stage shared one
consumer group, the offsets it committed passed the other stages' letters, and a later
redrive of those stages found nothing.
"""

from __future__ import annotations

import pytest

from consumers.dead_letter import CAUSES, DeadLetter, KafkaDeadLetterSink
from memoryd.redrive import RedriveError, redrive
from tests.support.builders import make_event
from tests.support.deployment import Deployment, topic_size

pytestmark = pytest.mark.integration


def test_each_stage_keeps_its_own_redrive_progress(deployment: Deployment) -> None:
    k = deployment.settings.kafka
    budget = [make_event("ada", f"budget {i}") for i in range(2)]
    consolidate = [make_event("bob", f"consolidate {i}") for i in range(3)]
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
    try:
        sink.send(
            [
                DeadLetter(
                    e.kafka_key, e.to_bytes(), stage, "test", k.topic, 0, i, CAUSES[stage][0]
                )
                for i, (e, stage) in enumerate(
                    [(e, "budget") for e in budget] + [(e, "consolidate") for e in consolidate]
                )
            ],
            {},  # no consumer's offsets move with them
            None,
        )
    finally:
        sink.close()

    assert redrive(deployment.settings, stages=["budget"], idle_s=1.0).redriven == 2
    assert topic_size(k.bootstrap_servers, k.topic) == 2
    # The budget redrive read past the consolidate letters: they are still there for theirs.
    assert redrive(deployment.settings, stages=["consolidate"], idle_s=1.0).redriven == 3
    assert topic_size(k.bootstrap_servers, k.topic) == 5
    # Each stage's progress is kept: nothing is redriven twice.
    assert redrive(deployment.settings, idle_s=1.0).redriven == 0
    assert topic_size(k.bootstrap_servers, k.topic) == 5

    with pytest.raises(RedriveError, match="not a redrivable stage: decode"):
        redrive(deployment.settings, stages=["decode"], idle_s=1.0)
