"""Tensors as the serving protocols write them: KServe V2's datatype names and raw bytes (its
HTTP binary extension and gRPC's `raw_input_contents`), TensorFlow Serving's `DT_*` enums and
shapes. Pure numpy; no protocol's package.

```python
from tfdist.serving import tensors
tensors.datatype("float32")                          # "FP32"
array = tensors.from_raw(raw, "FP32", [2, 4])        # 32 bytes -> a (2, 4) float32 array
tensors.to_raw(array) == raw                         # True
```
"""

from __future__ import annotations

import struct

import numpy as np

DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
             "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32",
             "int64": "INT64", "float16": "FP16", "float32": "FP32", "float64": "FP64",
             "string": "BYTES"}
"""KServe V2's datatype of each TensorFlow dtype a served model may have (by `tf.DType.name`)."""

_NUMPY = {v: ("object" if k == "string" else k) for k, v in DATATYPES.items()}


_TYPED_FIELDS = {"float32": "float_val", "float64": "double_val", "int8": "int_val",
                 "int16": "int_val", "int32": "int_val", "uint8": "int_val",
                 "uint16": "int_val", "int64": "int64_val", "uint32": "uint32_val",
                 "uint64": "uint64_val", "bool": "bool_val", "float16": "half_val",
                 "bfloat16": "half_val", "complex64": "scomplex_val",
                 "complex128": "dcomplex_val", "string": "string_val"}


def typed_field(array: np.ndarray, dtype: str) -> tuple[str, list]:
  """The TensorProto field and values TensorFlow Serving answers a tensor of TensorFlow dtype
  `dtype` in by default (its predict_util's `AsProtoField`: `float_val`, `int64_val`,
  `string_val`, ...; half types as their 16 bits in `half_val`, complex numbers as real and
  imaginary parts), not packed `tensor_content`: clients read the typed fields.

  ```python
  typed_field(np.array([[0.5, 1.5]], "float32"), "float32")   # ("float_val", [0.5, 1.5])
  ```
  """
  flat = np.ravel(array)
  if dtype in ("float16", "bfloat16"):
    return "half_val", flat.view(np.uint16).tolist()
  if dtype.startswith("complex"):
    return _TYPED_FIELDS[dtype], np.stack([flat.real, flat.imag], axis=-1).ravel().tolist()
  if dtype == "string":
    return "string_val", [v if isinstance(v, bytes) else str(v).encode() for v in flat]
  return _TYPED_FIELDS[dtype], flat.tolist()


def datatype(dtype: str) -> str:
  """KServe V2's name of TensorFlow dtype `dtype` ("float32" -> "FP32").

  Raises:
    ValueError: a dtype the protocol has no name for (bfloat16: its BF16 is Triton's own).
  """
  if dtype not in DATATYPES:
    raise ValueError(f"dtype {dtype} has no KServe V2 datatype")
  return DATATYPES[dtype]


def numpy_dtype(kserve: str, where: str) -> np.dtype:
  """The numpy dtype of KServe V2 datatype `kserve`; `where` names the field in the error.

  Raises:
    ValueError: an unknown datatype, naming `where`, the known ones and what was received.
  """
  if kserve not in _NUMPY:
    raise ValueError(f"{where}: expected a KServe V2 datatype ({', '.join(_NUMPY)}). "
                     f"Received: {kserve!r}")
  return np.dtype(_NUMPY[kserve])


def shaped(values, kserve: str, shape, where: str) -> np.ndarray:
  """`values` (flat or nested, as JSON or a proto's repeated field holds them) as an array of
  `shape` and the datatype's dtype.

  Raises:
    ValueError: the values are not of the datatype, or their count is not the shape's.
  """
  dtype = numpy_dtype(kserve, f"{where}.datatype")
  shape = checked_shape(shape, f"{where}.shape")
  try:
    if kserve == "BYTES":
      flat = np.array([v.encode() if isinstance(v, str) else bytes(v)
                       for v in np.asarray(values, dtype=object).ravel()], dtype=object)
    else:
      flat = np.asarray(values).ravel()
      if flat.size and flat.dtype.kind not in "biuf":
        raise TypeError(f"{flat.dtype.name} values")
      if flat.dtype.kind == "f" and dtype.kind in "biu":
        raise TypeError("numbers with a fraction")
      flat = flat.astype(dtype)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where}.data: expected {kserve} values. Received: {e}") from None
  if flat.size != int(np.prod(shape)):
    raise ValueError(f"{where}.data: expected {int(np.prod(shape))} values (shape "
                     f"{list(shape)}). Received: {flat.size}")
  return flat.reshape(shape)


def checked_shape(shape, where: str) -> tuple[int, ...]:
  """`shape` as a tuple of sizes >= 0.

  Raises:
    ValueError: not a list of non-negative integers.
  """
  if not isinstance(shape, (list, tuple)) or not all(
      isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
    raise ValueError(f"{where}: expected a list of sizes (non-negative integers). "
                     f"Received: {shape!r}")
  return tuple(shape)


def from_raw(raw: bytes, kserve: str, shape, where: str) -> np.ndarray:
  """An array from KServe V2's raw bytes: little-endian values in row-major order, or for
  BYTES each element's 4-byte little-endian length then its bytes.

  Raises:
    ValueError: the bytes do not hold `shape` values of the datatype.
  """
  dtype = numpy_dtype(kserve, f"{where}.datatype")
  shape = checked_shape(shape, f"{where}.shape")
  count = int(np.prod(shape))
  if kserve != "BYTES":
    if len(raw) != count * dtype.itemsize:
      raise ValueError(f"{where}: expected {count * dtype.itemsize} bytes ({count} {kserve} "
                       f"values, shape {list(shape)}). Received: {len(raw)}")
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape)
  values, at = [], 0
  while at < len(raw):
    if at + 4 > len(raw):
      raise ValueError(f"{where}: a BYTES element's 4-byte length is cut short at byte {at}")
    (size,) = struct.unpack_from("<I", raw, at)
    values.append(raw[at + 4:at + 4 + size])
    at += 4 + size
    if at > len(raw):
      raise ValueError(f"{where}: a BYTES element of {size} bytes runs past the data")
  if len(values) != count:
    raise ValueError(f"{where}: expected {count} BYTES elements (shape {list(shape)}). "
                     f"Received: {len(values)}")
  return np.array(values, dtype=object).reshape(shape)


def to_raw(array: np.ndarray) -> bytes:
  """KServe V2's raw bytes of `array` (the inverse of `from_raw`)."""
  array = np.asarray(array)
  if array.dtype == object or array.dtype.kind in "SU":
    return b"".join(struct.pack("<I", len(v)) + v for v in (
        x.encode() if isinstance(x, str) else bytes(x) for x in array.ravel()))
  return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def json_values(array: np.ndarray) -> list:
  """`array`'s values, flat, as JSON writes them (BYTES as text)."""
  array = np.asarray(array)
  if array.dtype == object:
    return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in array.ravel()]
  return array.ravel().tolist()
