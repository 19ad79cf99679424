#include "python/pad.h"

#include "python/leaves.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstring>

namespace fastcollate {
namespace {

enum ListRank { kNoList = -2, kEmptyLists = -1, kBool = 0, kInt = 1, kFloat = 2 };

at::ScalarType list_dtype(int rank) {
  switch (rank) {
    case kBool: return at::kBool;
    case kFloat: return at::kFloat;
    default: return at::kLong;  // ints, or a column of only empty lists (token ids)
  }
}

FillPiece make_fill(size_t dst, size_t nbytes, const uint8_t* pattern, size_t size) {
  FillPiece f{};
  f.dst_offset = dst;
  f.nbytes = nbytes;
  f.pattern_size = static_cast<uint8_t>(size);
  std::memcpy(f.pattern, pattern, size);
  return f;
}

// One list's values converted as torch.as_tensor would, appended to the plan's scalar buffer.
bool write_list(Plan& plan, PyObject* list, int64_t count, at::ScalarType dtype, size_t dst) {
  if (count == 0) return true;
  const size_t item = c10::elementSize(dtype);
  const size_t at = plan.scalars.size();
  plan.scalars.resize(at + count * item);
  uint8_t* out = plan.scalars.data() + at;
  PyObject** items = PySequence_Fast_ITEMS(list);
  for (int64_t j = 0; j < count; ++j) {
    PyObject* x = items[j];
    if (dtype == at::kBool) {
      out[j] = x == Py_True ? 1 : 0;
    } else if (dtype == at::kLong) {
      int overflow = 0;
      const int64_t v = PyLong_AsLongLongAndOverflow(x, &overflow);
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      std::memcpy(out + j * 8, &v, 8);
    } else {  // float32: Python number -> double -> float, as torch converts it
      const double d = PyFloat_Check(x) ? PyFloat_AS_DOUBLE(x) : PyLong_AsDouble(x);
      if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      const float f = static_cast<float>(d);
      std::memcpy(out + j * 4, &f, 4);
    }
  }
  plan.scalar_pieces.push_back({at, dst, count * item});
  return true;
}

}  // namespace

PadConfig PadConfig::parse(py::handle spec) {
  PadConfig c;
  py::dict d = py::reinterpret_borrow<py::dict>(spec);
  for (py::handle kv : py::reinterpret_borrow<py::iterable>(d["values"])) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(kv);
    c.values.emplace_back(t[0], t[1]);
  }
  c.multiple = d["multiple"].cast<int64_t>();
  c.max_length = d["max_length"].cast<int64_t>();
  c.left = d["left"].cast<bool>();
  c.mask_key = d["mask_key"];
  py::object dt = d["mask_dtype"];
  TORCH_CHECK(THPDtype_Check(dt.ptr()), "fastcollate: mask_dtype must be a torch.dtype");
  c.mask_dtype = reinterpret_cast<THPDtype*>(dt.ptr())->scalar_type;
  c.lengths_key = d["lengths_key"];
  c.defer_column = d["defer_column"];
  c.defer_batch = d["defer_batch"];
  return c;
}

const py::object* PadConfig::value_for(PyObject* key) const {
  for (const auto& kv : values) {
    const int eq = PyObject_RichCompareBool(key, kv.first.ptr(), Py_EQ);
    if (eq < 0) PyErr_Clear();
    if (eq == 1) return &kv.second;
  }
  return nullptr;
}

std::vector<int64_t> pad_column(Plan& plan, Node& node, PyObject* const* samples, size_t n, const py::object& key,
                                const py::object& value, const PadConfig& cfg) {
  auto defer = [&]() {
    py::list column(n);
    for (size_t i = 0; i < n; ++i) column[i] = py::reinterpret_borrow<py::object>(samples[i]);
    py::tuple r = cfg.defer_column(column, key);
    ++plan.deferred;
    place_tensor(plan, node, r[0].cast<at::Tensor>());
    return r[1].cast<std::vector<int64_t>>();
  };
  std::vector<at::Tensor> tensors(n);  // undefined for list samples
  std::vector<py::object> lists(n);
  std::vector<int64_t> lengths(n);
  int rank = kNoList;
  const at::Tensor* first = nullptr;
  for (size_t i = 0; i < n; ++i) {
    PyObject* s = samples[i];
    if (THPVariable_CheckExact(s)) {
      tensors[i] = THPVariable_Unpack(s);
    } else if (const int r = numpy_to_tensor(s, &tensors[i]); r != 0) {
      if (r < 0) return defer();
    } else if (PyList_CheckExact(s) || PyTuple_CheckExact(s)) {
      lists[i] = py::reinterpret_steal<py::object>(PySequence_Fast(s, ""));
      rank = std::max(rank, static_cast<int>(kEmptyLists));
      const Py_ssize_t m = PySequence_Fast_GET_SIZE(lists[i].ptr());
      PyObject** items = PySequence_Fast_ITEMS(lists[i].ptr());
      for (Py_ssize_t j = 0; j < m; ++j) {
        if (PyBool_Check(items[j])) rank = std::max(rank, static_cast<int>(kBool));
        else if (PyLong_CheckExact(items[j])) rank = std::max(rank, static_cast<int>(kInt));
        else if (PyFloat_CheckExact(items[j])) rank = std::max(rank, static_cast<int>(kFloat));
        else return defer();  // nested lists, strings...: the reference says what is wrong
      }
      lengths[i] = m;
      continue;
    } else {
      return defer();
    }
    const at::Tensor& t = tensors[i];
    if (!plain_tensor(t) || t.dim() == 0) return defer();
    lengths[i] = t.size(0);
  }
  // The first non-empty sample decides dtype and trailing dims (sample 0 when all are empty):
  // an empty sequence carries no values, so its dtype -- and, 1-D, its trailing dims -- do not
  // count (pad.py's rule). Lists take as_tensor's dtype over the whole column.
  size_t ref = 0;
  while (ref < n && lengths[ref] == 0) ++ref;
  if (ref == n) ref = 0;
  if (tensors[ref].defined()) first = &tensors[ref];
  const at::ScalarType dtype = first != nullptr ? first->scalar_type() : list_dtype(rank);
  const c10::IntArrayRef trailing_ref = first != nullptr ? first->sizes().slice(1) : c10::IntArrayRef{};
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined()) {  // a list: 1-D, as_tensor's dtype
      if (lengths[i] > 0 && (list_dtype(rank) != dtype || !trailing_ref.empty())) return defer();
      continue;
    }
    if (t.size(0) == 0 && (t.dim() == 1 || t.sizes().slice(1) == trailing_ref)) continue;
    if (t.scalar_type() != dtype || t.sizes().slice(1) != trailing_ref) return defer();
  }
  std::vector<int64_t> trailing = first != nullptr ? first->sizes().slice(1).vec() : std::vector<int64_t>{};
  int64_t row_elems = 1;
  for (int64_t d : trailing) row_elems *= d;
  const size_t item = c10::elementSize(dtype);
  const size_t row = static_cast<size_t>(row_elems) * item;

  int64_t L = 0;
  for (auto& len : lengths) {
    if (cfg.max_length >= 0) len = std::min(len, cfg.max_length);
    L = std::max(L, len);
  }
  if (cfg.multiple > 0) L = (L + cfg.multiple - 1) / cfg.multiple * cfg.multiple;

  uint8_t pattern[16] = {0};
  try {  // at::full refuses a value the dtype cannot hold (-100 in uint8): the reference says so
    at::Scalar v = PyBool_Check(value.ptr()) ? at::Scalar(value.cast<bool>())
                   : PyLong_Check(value.ptr()) ? at::Scalar(value.cast<int64_t>())
                                               : at::Scalar(value.cast<double>());
    at::Tensor p = at::full({1}, v, at::TensorOptions().dtype(dtype));
    // an integer (or bool) leaf must hold the value exactly; ATen's fill would wrap -100 to 156
    if (c10::isIntegralType(dtype, /*includeBool=*/true) && p.item<double>() != v.toDouble()) return defer();
    std::memcpy(pattern, p.data_ptr(), item);
  } catch (const std::exception&) {
    PyErr_Clear();
    return defer();
  }

  const Plan::Mark before = plan.mark();
  node.kind = NodeKind::Tensor;
  node.dtype = dtype;
  node.sizes = {static_cast<int64_t>(n), L};
  node.sizes.insert(node.sizes.end(), trailing.begin(), trailing.end());
  node.nbytes = n * static_cast<size_t>(L) * row;
  node.offset = plan.reserve(node.nbytes);
  ++plan.tensor_leaves;
  if (row == 0) return lengths;
  for (size_t i = 0; i < n; ++i) {
    const size_t sample = node.offset + i * static_cast<size_t>(L) * row;
    const int64_t real = lengths[i];
    const size_t pad_bytes = static_cast<size_t>(L - real) * row;
    const size_t data = cfg.left ? sample + pad_bytes : sample;
    if (tensors[i].defined()) {
      add_rows(plan, tensors[i], real, data, /*keep=*/true);
    } else if (!write_list(plan, lists[i].ptr(), real, dtype, data)) {
      plan.rollback(before);  // an int that overflows int64: the reference raises torch's error
      node = Node();
      return defer();
    }
    if (pad_bytes > 0) plan.fills.push_back(make_fill(cfg.left ? sample : sample + real * row, pad_bytes, pattern, item));
  }
  return lengths;
}

void mask_leaf(Plan& plan, Node& node, const std::vector<int64_t>& lengths, int64_t L, const PadConfig& cfg) {
  const at::ScalarType dtype = cfg.mask_dtype;
  const size_t item = c10::elementSize(dtype);
  const size_t n = lengths.size();
  node.kind = NodeKind::Tensor;
  node.dtype = dtype;
  node.sizes = {static_cast<int64_t>(n), L};
  node.nbytes = n * static_cast<size_t>(L) * item;
  node.offset = plan.reserve(node.nbytes);
  ++plan.tensor_leaves;
  const uint8_t one[8] = {1, 0, 0, 0, 0, 0, 0, 0};  // little-endian 1 of any integer width
  const uint8_t zero[8] = {0};
  for (size_t i = 0; i < n; ++i) {
    const size_t sample = node.offset + i * static_cast<size_t>(L) * item;
    const size_t real = static_cast<size_t>(lengths[i]) * item;
    const size_t pad = static_cast<size_t>(L) * item - real;
    const size_t real_at = cfg.left ? sample + pad : sample;
    const size_t pad_at = cfg.left ? sample : sample + real;
    if (real > 0) plan.fills.push_back(make_fill(real_at, real, one, item));
    if (pad > 0) plan.fills.push_back(make_fill(pad_at, pad, zero, item));
  }
}

void lengths_leaf(Plan& plan, Node& node, const std::vector<int64_t>& lengths) {
  node.kind = NodeKind::Tensor;
  node.dtype = at::kLong;
  node.sizes = {static_cast<int64_t>(lengths.size())};
  node.nbytes = lengths.size() * sizeof(int64_t);
  node.offset = plan.reserve(node.nbytes);
  ++plan.tensor_leaves;
  const size_t at = plan.scalars.size();
  plan.scalars.resize(at + node.nbytes);
  std::memcpy(plan.scalars.data() + at, lengths.data(), node.nbytes);
  plan.scalar_pieces.push_back({at, node.offset, node.nbytes});
}

}  // namespace fastcollate
