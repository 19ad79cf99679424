"""The sample cache: ``fastcollate.Cached(dataset)`` keeps each sample the first epoch produced,
encoded, in shared memory that every worker -- and every rank of the node -- reads.

Its parts: ``cached`` (the dataset wrapper and its index), ``codec`` (a sample as bytes and back),
``identity`` (the fingerprint that says two ranks wrap the same dataset), ``per_node`` (how the
ranks of a node find one cache), ``room`` (how much memory it may take), ``wrapper`` (a wrapper
transparent to the dataset's attributes)."""
from .cached import MAX_BYTES, Cached
from .room import default_max_bytes, memory_available

__all__ = ["Cached", "MAX_BYTES", "default_max_bytes", "memory_available"]
