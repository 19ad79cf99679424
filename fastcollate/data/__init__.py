"""Storage -> batches: datasets over arrays, memmaps, Arrow and token streams whose batches are
gathered in C++ (the core calls their batch's ``__fastcollate_gather__`` hook), and samplers."""
