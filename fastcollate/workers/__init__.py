"""DataLoader workers -> the main process: the loader, the recycled ring of shared slots and its
handles, page-locked slots and the fences before one is reused."""
