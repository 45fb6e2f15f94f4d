"""Development tools run from a checkout (`make run`, the tests, the benches); not in the wheel."""
