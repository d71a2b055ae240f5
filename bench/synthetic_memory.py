"""Synthetic memory for the benches: users, connections and facts, loaded in bulk.

Facts come from templates with per-user variation (names, cities, projects, tools, dates):
20 % in one of the user's two connections, 5 % archived or contradicted, 1 % pinned. Their
vectors are not computed by the model for every fact, which would take 40 minutes per million
at 410 texts/s: a pool of distinct texts is embedded once, every fact takes one pool text
(numbered when a user has more facts than the pool has texts) and its vector is that text's
vector plus a tenth of another pool vector, normalized. Deterministic for a seed, so growing
to a larger size adds to what is loaded. Postgres is written with COPY, Chroma in batches of
the server's maximum size with the vectors given.
"""

from __future__ import annotations

import io
import json
import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

from domain.ids import MemoryKey, fact_id_for
from domain.model import Fact, FactStatus, FactType, Provenance, SurfacePolicy
from domain.ports import Embedder, Vector
from memoryd import wiring
from store.chroma import ChromaVectorIndex, close_client, http_client

ORGANIZATION = "bench-org"
CONNECTIONS_PER_USER = 2
NOW = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
PERTURBATION = 0.1

# --- synthetic memory ------------------------------------------------------------------

NAMES = [
    "Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena",
    "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Vik", "Wen", "Yara",
]  # fmt: skip
CITIES = [
    "Berlin", "Lisbon", "Kyoto", "Toronto", "Nairobi", "Oslo", "Lima", "Pune", "Austin", "Lyon",
    "Seoul", "Dublin", "Accra", "Porto", "Krakow", "Denver", "Hanoi", "Bergen", "Quito", "Turin",
]  # fmt: skip
PROJECTS = [
    "billing", "search", "onboarding", "ledger", "notifications", "payments", "mobile", "pricing",
    "analytics", "checkout", "identity", "reporting", "storage", "routing", "support", "growth",
]  # fmt: skip
TOOLS = [
    "Jira", "Linear", "Notion", "PagerDuty", "Figma", "Grafana", "Postgres", "Kafka", "Terraform",
    "Sentry", "Airflow", "dbt",
]  # fmt: skip
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]  # fmt: skip
HOBBIES = [
    "climbing", "the cello", "sourdough baking", "chess", "trail running", "pottery", "sailing",
    "watercolor painting", "birdwatching", "salsa dancing", "woodworking", "Japanese",
]  # fmt: skip
FOODS = [
    "vegetarian food", "spicy ramen", "oat flat whites", "green tea", "dark chocolate", "tacos",
    "Ethiopian food", "black coffee", "sushi", "lentil soup",
]  # fmt: skip
TEMPLATES = [
    "The user lives in {city} and commutes by bike most days.",
    "The user works on the {project} team and reports to {name}.",
    "The user is migrating the {project} service to {tool} before the end of {month}.",
    "The user asked to be reminded about the {project} design review on {month} {day}.",
    "The user prefers concise answers with code examples about {tool}.",
    "The user's manager {name} wants weekly status notes on the {project} launch.",
    "The user is planning a trip to {city} in {month} with {name}.",
    "The user spends weekends on {hobby} and has done so for {n} years.",
    "The user likes {food} and avoids meetings before 10am.",
    "The user's colleague {name} owns the {tool} integration for {project}.",
    "The {project} launch slipped by {n} weeks because a {tool} migration was late.",
    "The user has a cat named {name} who is {n} years old.",
    "The user is learning {hobby} in the evenings, about {n} hours a week.",
    "The user keeps incident notes for {project} in {tool}.",
    "The user met {name} in {city} in {month} to discuss the {project} roadmap.",
]
QUERIES = [
    "Where does the user live?",
    "What is the user working on this month?",
    "Who is the user's manager?",
    "When is the {project} design review?",
    "What does the user do on weekends?",
    "Which tools does the user use for {project}?",
    "Is the user travelling to {city} soon?",
    "What food does the user like?",
    "Why did the {project} launch slip?",
    "What should I remind the user about?",
]
# What a chat message says before its question. With them no two turns of a run ask the same
# text: a service caches a query's vector, and a bench that repeats its questions measures the
# cache instead of the model.
LEADS = [
    "Quick one before my call with {name} on {month} {day}:",
    "{name} asked me this on {month} {day}.",
    "I'm back from {city} and catching up on {project}.",
    "Still thinking about {hobby} and the {project} notes in {tool}.",
    "Context for the planning with {name} on {month} {day}:",
    "Following up on the {tool} thread from {city} with {name}.",
    "Before the {project} sync on {month} {day}, a question.",
    "It's been {n} days since I looked at {project} in {tool}.",
]


def fill(template: str, rng: random.Random) -> str:
    return template.format(
        city=rng.choice(CITIES),
        project=rng.choice(PROJECTS),
        tool=rng.choice(TOOLS),
        month=rng.choice(MONTHS),
        name=rng.choice(NAMES),
        hobby=rng.choice(HOBBIES),
        food=rng.choice(FOODS),
        day=rng.randint(1, 28),
        n=rng.randint(2, 12),
    )


def text_pool(size: int, seed: int = 5) -> list[str]:
    """`size` distinct fact texts, deterministic for a seed."""
    rng = random.Random(seed)
    pool: dict[str, None] = {}
    attempts = 0
    while len(pool) < size:
        attempts += 1
        if attempts > size * 50:
            raise ValueError(f"the templates cannot make {size} distinct texts")
        pool[fill(rng.choice(TEMPLATES), rng)] = None
    return list(pool)


def working_memory(user: str, rng: random.Random) -> str:
    """About 300 words, the size a consolidated W settles at."""
    sentences = [fill(rng.choice(TEMPLATES), rng) for _ in range(30)]
    return f"Context for {user}. " + " ".join(sentences)


def scaffold(rng: random.Random) -> dict[str, object]:
    return {
        "Role": f"Engineer on the {rng.choice(PROJECTS)} team",
        "Location": rng.choice(CITIES),
        "Projects": [fill(rng.choice(TEMPLATES), rng) for _ in range(5)],
        "Preferences": [fill(rng.choice(TEMPLATES), rng) for _ in range(5)],
        "Profile": [fill(rng.choice(TEMPLATES), rng) for _ in range(6)],
    }


# --- loading ---------------------------------------------------------------------------

_FACT_COLUMNS = (
    "fact_id, user_id, organization_id, content, context_type, source, connection_id,"
    " message_id, source_event_ids, fact_type, surface, status, pinned, confidence, salience,"
    " created_by_run, created_at, updated_at, indexed_at, version"
)


def _copy_text(value: object) -> str:
    """One field in COPY's text format."""
    if value is None:
        return r"\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, tuple):
        return "{" + ",".join(str(v) for v in value) + "}"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def load_users(c: wiring.Core, users: Sequence[str], seed: int) -> None:
    rows, connections = [], []
    for user in users:
        rng = random.Random(f"{seed}:memory:{user}")
        learned = [fill(rng.choice(TEMPLATES), rng) for _ in range(8)]
        rows.append(
            (
                user,
                ORGANIZATION,
                working_memory(user, rng),
                json.dumps(scaffold(rng)),
                json.dumps(learned),
                1,
                NOW,
            )
        )
        for connection in connection_ids(user):
            info = [f"{connection}: " + fill(rng.choice(TEMPLATES), rng) for _ in range(3)]
            connections.append((user, connection, ORGANIZATION, json.dumps(info)))
    with c.pool.connection() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO user_memory (user_id, organization_id, working_memory,"
            " information_scaffold, persistent_learned_info, version, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
        cur.executemany(
            "INSERT INTO connections (user_id, connection_id, organization_id,"
            " persistent_learned_info) VALUES (%s, %s, %s, %s)",
            connections,
        )


def load_facts(c: wiring.Core, facts: Sequence[Fact]) -> None:
    buffer = io.StringIO()
    for f in facts:
        p = f.provenance
        fields = (
            f.fact_id, f.user_id, f.organization_id, f.content, p.context_type, p.source,
            p.connection_id, p.message_id, p.source_event_ids, f.fact_type.value,
            f.surface.value, f.status.value, f.pinned, f.confidence, f.salience,
            f.created_by_run, f.created_at, f.updated_at, NOW, f.version,
        )  # fmt: skip
        buffer.write("\t".join(_copy_text(v) for v in fields) + "\n")
    with (
        c.pool.connection() as conn,
        conn.cursor() as cur,
        cur.copy(f"COPY memory_facts ({_FACT_COLUMNS}) FROM STDIN") as copy,
    ):
        copy.write(buffer.getvalue())


def analyze(c: wiring.Core) -> None:
    """Fresh planner statistics after a bulk load."""
    with c.pool.connection() as conn:
        conn.execute("ANALYZE memory_facts")


def user_ids(count: int, tier: int = 0) -> list[str]:
    """Users of one size tier; tier 0 keeps the names earlier versions of the bench used."""
    prefix = "bench-user" if tier == 0 else f"bench-user-t{tier}"
    return [f"{prefix}-{i:05d}" for i in range(count)]


def connection_ids(user_id: str) -> list[str]:
    return [f"{user_id}-conn-{j}" for j in range(CONNECTIONS_PER_USER)]


@dataclass(frozen=True)
class TextPool:
    """Distinct fact texts and their model vectors, unit rows."""

    texts: list[str]
    vectors: npt.NDArray[np.float32]

    @classmethod
    def embedded(cls, size: int, embedder: Embedder, seed: int) -> TextPool:
        texts = text_pool(size, seed)
        vectors = np.stack(embedder.embed(texts)).astype(np.float32)
        return cls(texts, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))


def make_facts(
    pool: TextPool, user: str, numbers: range, seed: int
) -> tuple[list[Fact], list[Vector]]:
    """Facts number `numbers` of a user, with their vectors; the same for the same seed."""
    size = len(pool.texts)
    order = random.Random(f"{seed}:{user}").sample(range(size), size)
    facts, anchors, others = [], [], []
    for i in numbers:
        rng = random.Random(f"{seed}:{user}:{i}")
        anchor = order[i % size]
        lap = i // size
        content = pool.texts[anchor] + (f" (note {lap})" if lap else "")
        connection = rng.choice(connection_ids(user)) if rng.random() < 0.2 else None
        roll = rng.random()
        status = (
            FactStatus.ARCHIVED
            if roll < 0.03
            else FactStatus.CONTRADICTED
            if roll < 0.05
            else FactStatus.ACTIVE
        )
        at = NOW - timedelta(days=rng.uniform(0, 180))
        facts.append(
            Fact(
                fact_id=fact_id_for(MemoryKey(ORGANIZATION, user), content, connection),
                user_id=user,
                organization_id=ORGANIZATION,
                content=content,
                fact_type=rng.choice([FactType.PROFILE, FactType.PREFERENCE, FactType.EPISODIC]),
                surface=SurfacePolicy.SPEAK,
                status=status,
                confidence=round(rng.uniform(0.6, 1.0), 2),
                salience=round(rng.uniform(0.3, 0.9), 2),
                provenance=Provenance(
                    context_type="fact",
                    source="interactive",
                    connection_id=connection,
                    message_id=f"msg-{i}",
                    source_event_ids=(uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/{i}"),),
                ),
                created_by_run=uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/run"),
                created_at=at,
                updated_at=at,
                pinned=rng.random() < 0.01,
            )
        )
        anchors.append(anchor)
        others.append(rng.randrange(size))
    mixed = pool.vectors[anchors] + PERTURBATION * pool.vectors[others]
    mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
    return facts, list(mixed)


def fact_batches(
    pool: TextPool, users: Sequence[str], numbers: range, seed: int, batch: int
) -> Iterator[tuple[list[Fact], list[Vector]]]:
    """Facts `numbers` of every user in batches of about `batch`, so a million never sit in
    memory at once."""
    facts: list[Fact] = []
    vectors: list[Vector] = []
    for user in users:
        more, their = make_facts(pool, user, numbers, seed)
        facts += more
        vectors += their
        if len(facts) >= batch:
            yield facts, vectors
            facts, vectors = [], []
    if facts:
        yield facts, vectors


def index_facts(
    chroma_url: str,
    collection: str,
    embedder: Embedder,
    facts: Sequence[Fact],
    vectors: Sequence[Vector],
) -> None:
    client = http_client(chroma_url, timeout_s=300)
    try:
        ChromaVectorIndex(client, embedder, collection).upsert_embedded(facts, vectors)
    finally:
        close_client(client)


def fill_query(rng: random.Random) -> str:
    """A templated question about a user's memory."""
    return fill(rng.choice(QUERIES), rng)


def chat_turns(rng: random.Random) -> Iterator[str]:
    """Chat messages, no two alike: a lead-in and a templated question (millions of them)."""
    seen: set[str] = set()
    while True:
        turn = f"{fill(rng.choice(LEADS), rng)} {fill_query(rng)}"
        if turn not in seen:
            seen.add(turn)
            yield turn
