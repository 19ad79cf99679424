// The worker ring's tensors (GIL held): a worker's claimed slot as a view, the main process's
// lease of a filled slot -- a storage whose deleter frees the slot, or hands it to a fenced
// ring's Python hook -- and the views of a leased batch. The slot states themselves are the
// engine's (engine/ring_state.h).
#include <torch/csrc/utils/pybind.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>

#include "bindings/register.h"
#include "python/nogil.h"
#include "engine/ring_state.h"
#include "engine/shared_fd.h"
#include "python/plan.h"

namespace fastcollate {
namespace {

// Keeps the ring and control mappings alive as long as a batch's views do. `on_release`, when
// set (page-locked rings), decides when the slot is free again: an asynchronous copy may still
// be reading it after the last view has died, so Python records a fence and frees it later.
struct SlotLease {
  at::Tensor ring;
  at::Tensor ctrl;
  int64_t slot;
  PyObject* on_release;  // owned reference, or nullptr
  pid_t owner;           // the process that leased the slot: only it may free it
};

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

void end_lease(void* ctx) {
  std::unique_ptr<SlotLease> lease(static_cast<SlotLease*>(ctx));
  // A forked child's copy of a batch (a DataLoader worker forked while the parent held it)
  // shares the control block: freeing the slot there would hand the parent's bytes to a worker
  // while the parent still reads them. The child's reference to the hook is leaked with the
  // child's copy of the heap.
  if (getpid() != lease->owner) {
    lease->on_release = nullptr;
    return;
  }
  if (lease->on_release == nullptr) {
    ring_transfer(lease->ctrl, lease->slot, kRingHeldByMain, 0);
    return;
  }
  // The slot stays held (-1) unless the hook frees it: a lost fence leaks a slot, never reuses
  // one early. The deleter may run on any thread, with or without the GIL. While the
  // interpreter finalizes, Python may be half torn down (and PyGILState_Ensure may never return
  // on a non-Python thread): the process is going away, so the slot stays held.
  if (!Py_IsInitialized() || finalizing()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  // The last view may die while an exception propagates (a temporary passed to an op that
  // raises): calling Python with the error indicator set turns it into a SystemError and loses
  // the call, so the user's exception is set aside and restored unchanged.
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* saved = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
#endif
  PyObject* r = PyObject_CallFunction(lease->on_release, "L", static_cast<long long>(lease->slot));
  if (r == nullptr) {
    PyErr_WriteUnraisable(lease->on_release);
  }
  Py_XDECREF(r);
  Py_DECREF(lease->on_release);
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(saved);
#else
  PyErr_Restore(type, value, traceback);
#endif
  PyGILState_Release(gil);
}

// A worker's claim of a slot: the arena its collate writes into. The claim has a storage of its
// own (over the slot's bytes, not the ring's whole storage), so the ring learns when the worker's
// last view of the batch dies: a batch that was never sent -- its collate raised, or a collate
// that post-processes ours dropped it -- frees its slot then; a sent one is the main process's
// to free (its lease, when the batch's last view dies there).
struct WorkerClaim {
  at::Tensor ring;
  at::Tensor ctrl;
  int64_t slot;
  int64_t tag;  // the worker's pid: the slot's state while the worker owns it
  int64_t nbytes;
  pid_t owner;
  std::atomic<bool> sent{false};
};

void end_claim(void* ctx) {
  std::unique_ptr<WorkerClaim> claim(static_cast<WorkerClaim*>(ctx));
  // a process forked from the worker holds a copy of the views, not the claim
  if (!claim->sent.load() && getpid() == claim->owner) ring_transfer(claim->ctrl, claim->slot, claim->tag, 0);
}

// The largest byte a view of sizes/strides at byte_offset touches, + 1 (0 for an empty view).
int64_t view_extent(int64_t byte_offset, size_t item, const std::vector<int64_t>& sizes,
                    const std::vector<int64_t>& strides) {
  int64_t last = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    TORCH_CHECK(sizes[d] > 0 && strides[d] >= 0, "fastcollate: a leaf of shape ", sizes, " and strides ", strides,
                " cannot be a view of a batch arena");
    last += (sizes[d] - 1) * strides[d];
  }
  return byte_offset + (last + 1) * static_cast<int64_t>(item);
}

}  // namespace

// A worker claims a free slot for a batch of nbytes: (slot, a uint8 tensor over its first nbytes
// whose storage is the claim), or (-1, None) when none is free. Never releases the GIL (see
// ring_claim_view).
py::tuple ring_claim_slot(const at::Tensor& ring, const at::Tensor& ctrl, int64_t tag, int64_t slot_bytes,
                          int64_t nbytes) {
  TORCH_CHECK(ring.device().is_cpu() && ring.scalar_type() == at::kByte && ring.is_contiguous(),
              "fastcollate ring: the ring must be a contiguous uint8 CPU tensor");
  TORCH_CHECK(nbytes >= 0 && nbytes <= slot_bytes, "fastcollate ring: a batch of ", nbytes,
              " bytes does not fit a slot of ", slot_bytes);
  const int64_t slot = ring_claim(ctrl, tag);
  if (slot < 0) return py::make_tuple(slot, py::none());
  TORCH_CHECK((slot + 1) * slot_bytes <= ring.numel(), "fastcollate ring: slot ", slot, " is outside the ring");
  uint8_t* data = ring.data_ptr<uint8_t>() + slot * slot_bytes;
  auto claim = std::make_unique<WorkerClaim>();
  claim->ring = ring;
  claim->ctrl = ctrl;
  claim->slot = slot;
  claim->tag = tag;
  claim->nbytes = nbytes;
  claim->owner = getpid();
  c10::DataPtr ptr(data, claim.release(), &end_claim, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), nullptr, false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    caffe2::TypeMeta::Make<uint8_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return py::make_tuple(slot, t);
}

// For a tensor that lies in a worker's claim (ring_claim_slot): (ring address, slot, tag,
// nbytes, the tensor's byte offset in the slot), and the claim is marked sent -- its slot is
// then the main process's to free. None for any other tensor.
py::object ring_claim_send(const at::Tensor& t) {
  if (!t.has_storage() || !t.device().is_cpu()) return py::none();
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &end_claim) return py::none();
  auto* claim = static_cast<WorkerClaim*>(dp.get_context());
  claim->sent.store(true);
  const int64_t offset = t.storage_offset() * static_cast<int64_t>(t.element_size());
  return py::make_tuple(reinterpret_cast<int64_t>(claim->ring.data_ptr()), claim->slot, claim->tag, claim->nbytes,
                        offset);
}

// The main process takes slot `slot` (filled by worker `from`) for a batch: a uint8 tensor over
// its bytes whose storage, when the last view dies, frees the slot.
at::Tensor ring_lease(const at::Tensor& ring, const at::Tensor& ctrl, int64_t slot, int64_t from, int64_t slot_bytes,
                      int64_t nbytes, py::handle on_release) {
  TORCH_CHECK(ring.device().is_cpu() && ring.scalar_type() == at::kByte && ring.is_contiguous(),
              "fastcollate ring: the ring must be a contiguous uint8 CPU tensor");
  TORCH_CHECK(nbytes >= 0 && nbytes <= slot_bytes && (slot + 1) * slot_bytes <= ring.numel(),
              "fastcollate ring: a batch of ", nbytes, " bytes does not fit slot ", slot);
  TORCH_CHECK(ring_transfer(ctrl, slot, from, kRingHeldByMain), "fastcollate ring: slot ", slot, " is not held by pid ", from,
              " (state ", ring_state(ctrl, slot), ")");
  uint8_t* data = ring.data_ptr<uint8_t>() + slot * slot_bytes;
  PyObject* hook = on_release.is_none() ? nullptr : on_release.inc_ref().ptr();
  auto lease = std::make_unique<SlotLease>(SlotLease{ring, ctrl, slot, hook, getpid()});
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

// Maps every page of a slot's view into this process's page tables in one call. A DataLoader
// worker that is new (every epoch of a loader with persistent_workers=False) inherits the ring's
// shared mapping but none of its page table entries, so a batch written into a slot would take
// one minor fault per 4 KB page; MADV_POPULATE_WRITE (Linux 5.14) maps them all at once, and on
// a fresh slot allocates its pages the same way. False where the kernel refuses: the faults then
// happen as before, nothing else changes.
bool ring_populate(const at::Tensor& view) {
#ifdef MADV_POPULATE_WRITE
  constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
  constexpr int kPopulateWrite = 23;
#endif
  const size_t nbytes = view.numel() * view.element_size();
  if (nbytes == 0) return true;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(view.data_ptr()) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(view.data_ptr()) + nbytes;
  NoGil nogil;
  return madvise(reinterpret_cast<void*>(begin), end - begin, kPopulateWrite) == 0;
}

// A view of dtype, sizes and strides at byte_offset of a leased slot (the main process's side of
// a ring batch), made without releasing the GIL (see ring_claim_view).
// The same for any received arena (fastcollate.loader.wire): the view must lie inside it.
at::Tensor ring_view(const at::Tensor& lease, int64_t byte_offset, at::ScalarType dtype, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides) {
  TORCH_CHECK(byte_offset >= 0 && sizes.size() == strides.size(), "fastcollate ring: a leaf at byte ", byte_offset,
              " of ", dtype, " is misplaced");
  const int64_t end = view_extent(byte_offset, c10::elementSize(dtype), sizes, strides);
  TORCH_CHECK(end <= lease.numel() * static_cast<int64_t>(lease.element_size()), "fastcollate: a leaf of shape ",
              sizes, " at byte ", byte_offset, " runs past its arena of ", lease.numel(), " bytes");
  return arena_view(lease, static_cast<size_t>(byte_offset), dtype, sizes, strides);
}

void register_ring_ops(pybind11::module_& m) {
  m.def("ring_claim_view", &ring_claim_view, pybind11::arg("ring"), pybind11::arg("ctrl"), pybind11::arg("tag"),
        pybind11::arg("slot_bytes"), pybind11::arg("nbytes"));
  m.def("ring_view", &ring_view, pybind11::arg("lease"), pybind11::arg("byte_offset"), pybind11::arg("dtype"),
        pybind11::arg("sizes"), pybind11::arg("strides"));
  m.def("ring_populate", &ring_populate, pybind11::arg("view"));
  m.def("ring_claim_slot", &ring_claim_slot, pybind11::arg("ring"), pybind11::arg("ctrl"), pybind11::arg("tag"),
        pybind11::arg("slot_bytes"), pybind11::arg("nbytes"));
  m.def("ring_claim_send", &ring_claim_send, pybind11::arg("tensor"));
  m.def("map_fd", &map_fd, pybind11::arg("fd"), pybind11::arg("nbytes"));
  m.def(
      "read_fd",
      [](int fd, int64_t nbytes, const at::Tensor& out) {
        NoGil no_gil;
        read_fd(fd, nbytes, out);
      },
      pybind11::arg("fd"), pybind11::arg("nbytes"), pybind11::arg("out"));
  m.def("ring_claim", &ring_claim, pybind11::arg("ctrl"), pybind11::arg("tag"));
  m.def("ring_transfer", &ring_transfer, pybind11::arg("ctrl"), pybind11::arg("slot"), pybind11::arg("from_"),
        pybind11::arg("to"));
  m.def("ring_add", &ring_add);
  m.def("ring_states", &ring_states);
  m.def("ring_lease", &ring_lease, pybind11::arg("ring"), pybind11::arg("ctrl"), pybind11::arg("slot"),
        pybind11::arg("from_"), pybind11::arg("slot_bytes"), pybind11::arg("nbytes"),
        pybind11::arg("on_release") = pybind11::none());
  // the control block's words by name, for the Python side (fastcollate/workers/ring.py)
  py::dict words;
  words["hits"] = static_cast<int64_t>(kRingHits);
  words["full"] = static_cast<int64_t>(kRingFull);
  words["oversize"] = static_cast<int64_t>(kRingOversize);
  words["bytes"] = static_cast<int64_t>(kRingBytes);
  words["counters"] = static_cast<int64_t>(kRingCounters);
  words["slots"] = static_cast<int64_t>(kRingSlots);
  words["claim_hint"] = static_cast<int64_t>(kRingClaimHint);
  words["header"] = static_cast<int64_t>(kRingHeader);
  m.attr("ring_words") = words;
  m.attr("ring_held_by_main") = kRingHeldByMain;
}

}  // namespace fastcollate
