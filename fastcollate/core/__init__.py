"""Samples -> one arena: default_collate's semantics (the collator over the compiled engine), the
pure-Python reference (oracle, fallback, slow path), padding and tokenizer rows."""
