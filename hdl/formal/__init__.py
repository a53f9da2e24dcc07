"""Formal property wrappers: each wraps one design under test with free inputs (``AnySeq``),
the assumptions its documented input contract needs, shadow state and ``Assert``/``Cover``
statements. :mod:`sim.formal` runs them through SymbiYosys; ``docs/formal.md`` lists what is
proven."""
