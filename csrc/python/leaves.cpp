#include "python/leaves.h"

#include <torch/csrc/utils/tensor_numpy.h>

#include <cstddef>
#include <cstring>
#include <string>

#ifndef FASTCOLLATE_NUMPY_HEADERS
#define FASTCOLLATE_NUMPY_HEADERS 0  // a build that does not say: the buffer protocol
#endif
#if FASTCOLLATE_NUMPY_HEADERS
// Header-only parts of numpy (struct layouts and inline accessors, no C-API table): stable across
// numpy 1.x and 2.x, so a module built against one reads the other's arrays.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>
#include <numpy/arrayscalars.h>
#endif

namespace fastcollate {

const PyTypes& types() {
  static const PyTypes* t = [] {
    static PyTypes pt;
    py::module_ abc = py::module_::import("collections.abc");
    pt.mapping = py::object(abc.attr("Mapping")).release().ptr();
    pt.mutable_mapping = py::object(abc.attr("MutableMapping")).release().ptr();
    pt.sequence = py::object(abc.attr("Sequence")).release().ptr();
    pt.mutable_sequence = py::object(abc.attr("MutableSequence")).release().ptr();
    try {
      py::module_ np = py::module_::import("numpy");
      pt.ndarray = reinterpret_cast<PyTypeObject*>(py::object(np.attr("ndarray")).release().ptr());
      pt.np_scalars = py::make_tuple(np.attr("bool_"), np.attr("number"), np.attr("object_")).release().ptr();
      const std::pair<const char*, at::ScalarType> names[] = {
          {"bool_", at::kBool},      {"uint8", at::kByte},         {"int8", at::kChar},
          {"int16", at::kShort},     {"int32", at::kInt},          {"int64", at::kLong},
          {"float16", at::kHalf},    {"float32", at::kFloat},      {"float64", at::kDouble},
          {"complex64", at::kComplexFloat}, {"complex128", at::kComplexDouble}};
      for (const auto& [name, dtype] : names) {
        pt.np_scalar_dtype[reinterpret_cast<PyTypeObject*>(np.attr(name).ptr())] = dtype;
      }
    } catch (py::error_already_set&) {
      PyErr_Clear();  // no numpy: default_collate has no numpy rows either
    }
    return &pt;
  }();
  return *t;
}

bool refused_numpy_dtype(PyObject* array) {
  py::object dstr = py::reinterpret_borrow<py::object>(array).attr("dtype").attr("str");
  return dstr.cast<std::string>().find_first_of("SaUO") != std::string::npos;
}

bool isinstance(PyObject* obj, PyObject* cls) {
  const int r = PyObject_IsInstance(obj, cls);
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

bool plain_tensor(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && !t.is_nested() &&
         !t.is_quantized() && !t.requires_grad() && !t._is_zerotensor();
}

int numpy_to_tensor(PyObject* obj, at::Tensor* out) {
  const PyTypes& T = types();
  if (T.ndarray == nullptr || !PyObject_TypeCheck(obj, T.ndarray)) return 0;
  try {  // str/bytes/object arrays are refused here too (the walk checks sample 0's dtype string)
    *out = torch::utils::tensor_from_numpy(obj, /*warn_if_not_writeable=*/false);
  } catch (const std::exception&) {
    PyErr_Clear();
    return -1;  // negative strides, byte order...: torch.as_tensor's error, via the reference
  }
  return 1;
}

bool numpy_format(PyObject* obj, std::string* format) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  *format = view.format != nullptr ? view.format : "B";
  PyBuffer_Release(&view);
  return true;
}

const uint8_t* numpy_like(PyObject* obj, PyObject* first, const std::string& format0, const at::Tensor& t0) {
  const PyTypes& T = types();
  if (T.ndarray == nullptr || !PyObject_TypeCheck(obj, T.ndarray)) return nullptr;
#if FASTCOLLATE_NUMPY_HEADERS
  // The common column: every array shares sample 0's dtype object (numpy's built-in descriptors
  // are shared), C order, sample 0's shape. A few loads instead of a buffer export (~50 ns a
  // leaf); any doubt goes the buffer way below.
  auto* a = reinterpret_cast<PyArrayObject*>(obj);
  if (PyArray_DESCR(a) == PyArray_DESCR(reinterpret_cast<PyArrayObject*>(first)) && PyArray_NDIM(a) == t0.dim() &&
      (PyArray_FLAGS(a) & NPY_ARRAY_C_CONTIGUOUS) != 0) {
    const npy_intp* dims = PyArray_DIMS(a);
    bool same_shape = true;
    for (int d = 0; same_shape && d < PyArray_NDIM(a); ++d) same_shape = dims[d] == t0.size(d);
    if (same_shape) return static_cast<const uint8_t*>(PyArray_DATA(a));
  }
#endif
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return nullptr;
  }
  bool same = view.ndim == t0.dim() && view.itemsize == t0.element_size() &&
              format0 == (view.format != nullptr ? view.format : "B") && PyBuffer_IsContiguous(&view, 'C') == 1;
  for (int d = 0; same && d < view.ndim; ++d) same = view.shape[d] == t0.size(d);
  const auto* data = static_cast<const uint8_t*>(view.buf);
  // released at once: the sample's own reference (kept for the copy) keeps the memory alive
  PyBuffer_Release(&view);
  return same ? data : nullptr;
}

void add_rows(Plan& plan, const at::Tensor& t, int64_t rows, size_t dst_offset, bool keep) {
  const at::Tensor part = rows == t.size(0) ? t : t.narrow(0, 0, rows);
  const size_t nbytes = static_cast<size_t>(part.numel()) * part.element_size();
  if (nbytes == 0) return;
  if (part.is_contiguous() && !part.is_conj() && !part.is_neg()) {
    plan.pieces.push_back({static_cast<const uint8_t*>(part.const_data_ptr()), dst_offset, nbytes});
    if (keep) plan.keep_alive.push_back(part);
  } else {
    add_strided(plan, part, dst_offset);
  }
}

void add_strided(Plan& plan, const at::Tensor& t, size_t dst_offset) {
  TransposePiece piece;
  if (!t.is_conj() && !t.is_neg() &&
      as_transpose(t.sizes().data(), t.strides().data(), static_cast<int>(t.dim()), t.element_size(), &piece)) {
    piece.src = static_cast<const uint8_t*>(t.const_data_ptr());
    piece.dst_offset = dst_offset;
    plan.transposes.push_back(piece);
    plan.keep_alive.push_back(t);
    return;
  }
  plan.conversions.push_back({t, t.scalar_type(), t.sizes().vec(), dst_offset});
}

void place_tensor(Plan& plan, Node& node, const at::Tensor& t) {
  TORCH_CHECK(plain_tensor(t), "fastcollate: internal: a reference result to place is not a plain CPU tensor");
  node.kind = NodeKind::Tensor;
  node.dtype = t.scalar_type();
  node.sizes = t.sizes().vec();
  node.nbytes = t.numel() * t.element_size();
  node.offset = plan.reserve(node.nbytes);
  ++plan.tensor_leaves;
  if (!t.is_contiguous() && t.is_non_overlapping_and_dense() && !t.is_conj() && !t.is_neg()) {
    // torch.stack's result in channels_last (say): its dense block as it is, same strides
    node.strides = t.strides().vec();
    plan.pieces.push_back({static_cast<const uint8_t*>(t.const_data_ptr()), node.offset, node.nbytes});
    plan.keep_alive.push_back(t);
    return;
  }
  if (t.dim() == 0) {
    add_rows(plan, t.reshape({1}), 1, node.offset, true);
  } else {
    add_rows(plan, t, t.size(0), node.offset, true);
  }
}

}  // namespace fastcollate

namespace fastcollate {

bool numpy_structs() { return FASTCOLLATE_NUMPY_HEADERS != 0; }

#if FASTCOLLATE_NUMPY_HEADERS
// Every numeric scalar type is {PyObject_HEAD; value}: the value at one offset whatever its type.
constexpr size_t kScalarValue = offsetof(PyDoubleScalarObject, obval);
static_assert(offsetof(PyBoolScalarObject, obval) == kScalarValue && offsetof(PyByteScalarObject, obval) == kScalarValue &&
              offsetof(PyUByteScalarObject, obval) == kScalarValue && offsetof(PyShortScalarObject, obval) == kScalarValue &&
              offsetof(PyIntScalarObject, obval) == kScalarValue && offsetof(PyLongScalarObject, obval) == kScalarValue &&
              offsetof(PyLongLongScalarObject, obval) == kScalarValue && offsetof(PyHalfScalarObject, obval) == kScalarValue &&
              offsetof(PyFloatScalarObject, obval) == kScalarValue && offsetof(PyCFloatScalarObject, obval) == kScalarValue &&
              offsetof(PyCDoubleScalarObject, obval) == kScalarValue,
              "numpy scalar layouts differ");
#endif

void numpy_scalar_bytes(PyObject* scalar, uint8_t* out, size_t item) {
#if FASTCOLLATE_NUMPY_HEADERS
  std::memcpy(out, reinterpret_cast<const uint8_t*>(scalar) + kScalarValue, item);
#else
  Py_buffer view;
  if (PyObject_GetBuffer(scalar, &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  const bool ok = static_cast<size_t>(view.len) == item;
  if (ok) std::memcpy(out, view.buf, item);
  PyBuffer_Release(&view);
  if (!ok) throw std::runtime_error("fastcollate: numpy scalar buffer of unexpected size");
#endif
}

}  // namespace fastcollate
