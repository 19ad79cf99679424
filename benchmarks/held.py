"""The benchmark step both suites share: call fn, keeping the previous result alive as a
training loop holds its previous batch, grouped so pytest-benchmark shows the rivals together."""


def run_held(benchmark, group, fn, rounds=15, iterations=3):
    benchmark.group = group
    held = [fn()]

    def step():
        held[0] = fn()

    benchmark.pedantic(step, rounds=rounds, iterations=iterations, warmup_rounds=2)
