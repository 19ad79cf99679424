// The worker ring's slot states, in a small shared control block (int64 words) that every
// process of a DataLoader maps: lock-free atomics work across processes on shared memory; and
// the tensors over its slots (a worker's claimed slot, the main process's lease and views).
//   ctrl[0..7]  counters: 0 hits, 1 full (no free slot), 2 oversize, 3 bytes, 4 K, 5 claim hint
//   ctrl[8+i]   slot i: 0 free, >0 the pid of the worker that filled it, -1 held by the main
//               process (its views, then -- for page-locked rings -- the copies still reading it)
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <memory>

#include "plan.h"

namespace fastcollate {
namespace {

constexpr int64_t kHeader = 8;
constexpr int64_t kMain = -1;
static_assert(std::atomic<int64_t>::is_always_lock_free, "cross-process slot states need lock-free atomics");

std::atomic<int64_t>* words(const at::Tensor& ctrl) {
  TORCH_CHECK(ctrl.device().is_cpu() && ctrl.scalar_type() == at::kLong && ctrl.is_contiguous() && ctrl.numel() >= kHeader,
              "fastcollate ring: the control block must be a contiguous int64 CPU tensor");
  return reinterpret_cast<std::atomic<int64_t>*>(ctrl.data_ptr<int64_t>());
}

int64_t slots(const at::Tensor& ctrl) {
  const int64_t k = words(ctrl)[4].load();
  TORCH_CHECK(k >= 0 && kHeader + k <= ctrl.numel(), "fastcollate ring: corrupt control block");
  return k;
}

std::atomic<int64_t>& state(const at::Tensor& ctrl, int64_t slot) {
  TORCH_CHECK(slot >= 0 && slot < slots(ctrl), "fastcollate ring: slot ", slot, " out of range");
  return words(ctrl)[kHeader + slot];
}

// Keeps the ring and control mappings alive as long as a batch's views do. `on_release`, when
// set (page-locked rings), decides when the slot is free again: an asynchronous copy may still
// be reading it after the last view has died, so Python records a fence and frees it later.
struct SlotLease {
  at::Tensor ring;
  at::Tensor ctrl;
  int64_t slot;
  PyObject* on_release;  // owned reference, or nullptr
};

void end_lease(void* ctx) {
  std::unique_ptr<SlotLease> lease(static_cast<SlotLease*>(ctx));
  if (lease->on_release == nullptr) {
    int64_t expected = kMain;
    words(lease->ctrl)[kHeader + lease->slot].compare_exchange_strong(expected, 0);
    return;
  }
  // The slot stays held (-1) unless the hook frees it: a lost fence leaks a slot, never reuses
  // one early. The deleter may run on any thread, with or without the GIL.
  if (!Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallFunction(lease->on_release, "L", static_cast<long long>(lease->slot));
  if (r == nullptr) {
    PyErr_WriteUnraisable(lease->on_release);
  }
  Py_XDECREF(r);
  Py_DECREF(lease->on_release);
  PyGILState_Release(gil);
}

}  // namespace

int64_t ring_claim(const at::Tensor& ctrl, int64_t tag) {
  TORCH_CHECK(tag > 0, "fastcollate ring: a claim tag must be a positive pid");
  std::atomic<int64_t>* w = words(ctrl);
  const int64_t k = slots(ctrl);
  if (k == 0) return -1;
  const int64_t start = w[5].fetch_add(1) % k;  // spread workers over the slots
  for (int64_t j = 0; j < k; ++j) {
    const int64_t i = (start + j) % k;
    int64_t expected = 0;
    if (w[kHeader + i].compare_exchange_strong(expected, tag)) return i;
  }
  return -1;
}

bool ring_transfer(const at::Tensor& ctrl, int64_t slot, int64_t from, int64_t to) {
  int64_t expected = from;
  return state(ctrl, slot).compare_exchange_strong(expected, to);
}

void ring_add(const at::Tensor& ctrl, int64_t counter, int64_t value) {
  TORCH_CHECK(counter >= 0 && counter < 4, "fastcollate ring: no counter ", counter);
  words(ctrl)[counter].fetch_add(value);
}

std::vector<int64_t> ring_states(const at::Tensor& ctrl) {
  std::vector<int64_t> out(slots(ctrl));
  for (size_t i = 0; i < out.size(); ++i) out[i] = words(ctrl)[kHeader + i].load();
  return out;
}

// The main process takes slot `slot` (filled by worker `from`) for a batch: a uint8 tensor over
// its bytes whose storage, when the last view dies, frees the slot.
at::Tensor ring_lease(const at::Tensor& ring, const at::Tensor& ctrl, int64_t slot, int64_t from, int64_t slot_bytes,
                      int64_t nbytes, py::handle on_release) {
  TORCH_CHECK(ring.device().is_cpu() && ring.scalar_type() == at::kByte && ring.is_contiguous(),
              "fastcollate ring: the ring must be a contiguous uint8 CPU tensor");
  TORCH_CHECK(nbytes >= 0 && nbytes <= slot_bytes && (slot + 1) * slot_bytes <= ring.numel(),
              "fastcollate ring: a batch of ", nbytes, " bytes does not fit slot ", slot);
  TORCH_CHECK(ring_transfer(ctrl, slot, from, kMain), "fastcollate ring: slot ", slot, " is not held by pid ", from,
              " (state ", state(ctrl, slot).load(), ")");
  uint8_t* data = ring.data_ptr<uint8_t>() + slot * slot_bytes;
  PyObject* hook = on_release.is_none() ? nullptr : on_release.inc_ref().ptr();
  auto lease = std::make_unique<SlotLease>(SlotLease{ring, ctrl, slot, hook});
  c10::DataPtr ptr(data, lease.release(), &end_lease, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), nullptr, false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    caffe2::TypeMeta::Make<uint8_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return t;
}

// A worker's claim and its slot's first nbytes as a view of the ring, in one call that never
// releases the GIL: torch's Python bindings release it in every op (narrow included), and each
// release hands it to the worker's feeder thread, waiting to pickle the previous batch -- a
// round trip of the GIL per op, which profiles of a DataLoader worker showed.
py::tuple ring_claim_view(const at::Tensor& ring, const at::Tensor& ctrl, int64_t tag, int64_t slot_bytes,
                          int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0 && nbytes <= slot_bytes, "fastcollate ring: a batch of ", nbytes,
              " bytes does not fit a slot of ", slot_bytes);
  const int64_t slot = ring_claim(ctrl, tag);
  if (slot < 0) return py::make_tuple(slot, py::none());
  TORCH_CHECK((slot + 1) * slot_bytes <= ring.numel(), "fastcollate ring: slot ", slot, " is outside the ring");
  return py::make_tuple(slot, ring.narrow(0, slot * slot_bytes, nbytes));
}

// A view of dtype, sizes and strides at byte_offset of a leased slot (the main process's side of
// a ring batch), made without releasing the GIL (see ring_claim_view).
at::Tensor ring_view(const at::Tensor& lease, int64_t byte_offset, at::ScalarType dtype, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides) {
  TORCH_CHECK(byte_offset >= 0 && sizes.size() == strides.size(), "fastcollate ring: a leaf at byte ", byte_offset,
              " of ", dtype, " is misplaced");
  return arena_view(lease, static_cast<size_t>(byte_offset), dtype, sizes, strides);
}

void register_ring_ops(pybind11::module_& m) {
  m.def("ring_claim_view", &ring_claim_view, pybind11::arg("ring"), pybind11::arg("ctrl"), pybind11::arg("tag"),
        pybind11::arg("slot_bytes"), pybind11::arg("nbytes"));
  m.def("ring_view", &ring_view, pybind11::arg("lease"), pybind11::arg("byte_offset"), pybind11::arg("dtype"),
        pybind11::arg("sizes"), pybind11::arg("strides"));
  m.def("ring_claim", &ring_claim, pybind11::arg("ctrl"), pybind11::arg("tag"));
  m.def("ring_transfer", &ring_transfer, pybind11::arg("ctrl"), pybind11::arg("slot"), pybind11::arg("from_"),
        pybind11::arg("to"));
  m.def("ring_add", &ring_add);
  m.def("ring_states", &ring_states);
  m.def("ring_lease", &ring_lease, pybind11::arg("ring"), pybind11::arg("ctrl"), pybind11::arg("slot"),
        pybind11::arg("from_"), pybind11::arg("slot_bytes"), pybind11::arg("nbytes"),
        pybind11::arg("on_release") = pybind11::none());
  m.attr("ring_header") = kHeader;
}

}  // namespace fastcollate
