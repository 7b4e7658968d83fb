"""The package's version, in one place: the package, setup.cfg and every run's record read it."""

__version__ = "0.1.0"
