// The sample cache's index (engine/cache_state.h) bound for fastcollate/data/cache.py: the claim /
// reserve / publish protocol, lookups, counters, and the control block's words by name. Nothing
// here touches a Python object with the GIL released; the calls are a few atomics each, so none
// releases it.
#include <torch/csrc/utils/pybind.h>

#include "bindings/register.h"
#include "engine/cache_state.h"

namespace fastcollate {

void register_cache_ops(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<CacheSpan>(m, "CacheSpan", "A published cache entry's bytes in the data segment (offset -1: none).")
      .def_readonly("offset", &CacheSpan::offset)
      .def_readonly("length", &CacheSpan::length);
  py::class_<CacheClaimResult>(m, "CacheClaim", "What a writer's claim of a cache entry found (see _C.cache_claims).")
      .def_readonly("outcome", &CacheClaimResult::outcome)
      .def_readonly("holder", &CacheClaimResult::holder);
  m.def("cache_ctrl_words", &cache_ctrl_words, py::arg("entries"));
  m.def("cache_init", &cache_init, py::arg("ctrl"), py::arg("entries"), py::arg("capacity"));
  m.def("cache_find", &cache_find, py::arg("ctrl"), py::arg("index"));
  m.def("cache_claim", &cache_claim, py::arg("ctrl"), py::arg("index"), py::arg("tag"));
  m.def("cache_reserve", &cache_reserve, py::arg("ctrl"), py::arg("index"), py::arg("tag"), py::arg("nbytes"));
  m.def("cache_publish", &cache_publish, py::arg("ctrl"), py::arg("index"), py::arg("tag"), py::arg("offset"),
        py::arg("nbytes"));
  m.def("cache_release", &cache_release, py::arg("ctrl"), py::arg("index"), py::arg("from_"), py::arg("to"),
        py::arg("reclaimed") = false);
  m.def("cache_add", &cache_add, py::arg("ctrl"), py::arg("counter"), py::arg("value"));
  m.def("cache_state", &cache_state, py::arg("ctrl"), py::arg("index"));
  // the control block's layout and the protocol's constants by name, for fastcollate/data/cache.py
  py::dict words;
  words["hits"] = static_cast<int64_t>(kCacheHits);
  words["misses"] = static_cast<int64_t>(kCacheMisses);
  words["inserts"] = static_cast<int64_t>(kCacheInserts);
  words["payload"] = static_cast<int64_t>(kCachePayload);
  words["refused_full"] = static_cast<int64_t>(kCacheRefusedFull);
  words["uncacheable"] = static_cast<int64_t>(kCacheUncacheable);
  words["reclaimed"] = static_cast<int64_t>(kCacheReclaimed);
  words["hit_ns"] = static_cast<int64_t>(kCacheHitNs);
  words["fetch_ns"] = static_cast<int64_t>(kCacheFetchNs);
  words["insert_ns"] = static_cast<int64_t>(kCacheInsertNs);
  words["transform_ns"] = static_cast<int64_t>(kCacheTransformNs);
  words["counters"] = static_cast<int64_t>(kCacheCounters);
  words["entries"] = static_cast<int64_t>(kCacheEntries);
  words["capacity"] = static_cast<int64_t>(kCacheCapacity);
  words["top"] = static_cast<int64_t>(kCacheTop);
  words["full"] = static_cast<int64_t>(kCacheFull);
  words["header"] = static_cast<int64_t>(kCacheHeader);
  words["entry_words"] = static_cast<int64_t>(kCacheEntryWords);
  words["entry_state"] = static_cast<int64_t>(kEntryState);
  words["entry_offset"] = static_cast<int64_t>(kEntryOffset);
  words["entry_length"] = static_cast<int64_t>(kEntryLength);
  m.attr("cache_words") = words;
  py::dict states;
  states["empty"] = static_cast<int64_t>(0);
  states["ready"] = kEntryReady;
  states["uncacheable"] = kEntryUncacheable;
  states["refused"] = kEntryRefused;
  m.attr("cache_states") = states;
  py::dict claims;
  claims["claimed"] = static_cast<int64_t>(kClaimed);
  claims["ready"] = static_cast<int64_t>(kClaimReady);
  claims["busy"] = static_cast<int64_t>(kClaimBusy);
  claims["full"] = static_cast<int64_t>(kClaimFull);
  claims["skip"] = static_cast<int64_t>(kClaimSkip);
  m.attr("cache_claims") = claims;
  m.attr("cache_align") = kCacheAlign;
}

}  // namespace fastcollate
