"""The test suite. A package so that its helpers import by one name everywhere: `tests.support`."""
