"""Plain-text tables the CLI, the tuner and the benchmarks print."""


def table_rule(head: str) -> str:
    """The markdown rule under a table's header line, column widths kept."""
    return "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"
