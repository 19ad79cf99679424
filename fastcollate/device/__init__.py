"""Host -> GPU: the device-free prefetch thread, the transport (pin, one H2D copy per arena,
views, events) and the CudaPrefetcher that joins them."""
